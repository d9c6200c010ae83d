"""Flake hunt: run the notebooks (as ``make test`` does) and/or the server tests K times, under load.

Why: CI's ``make test`` must be green every time, not most times. A check that passes only when
timing cooperates (a wait that is just long enough, a port that is usually free, a batch that
usually fills) shows up here as "failed 1 of 5" long before it turns a CI run red. Each round runs
pytest once per suite, optionally while ``--hog N`` busy-loop processes keep N cores busy, and
every notebook cell / test lands in a CSV with its outcome and duration.

Run it:

    make flake                                   # FLAKE_ARGS defaults to --rounds 5 --hog 1
    make flake FLAKE_ARGS="--rounds 3 --only 03 03b 10 11"
    .venv/bin/python scripts/flake_hunt.py --what make-test --cwd /tmp/clone --rounds 1 --hog 1
    .venv/bin/python scripts/flake_hunt.py --what server-tests --only "batch or stream" --rounds 3

Writes ``bench/flakes.csv`` (``--csv``) and ``bench/flakes_summary.md`` next to it; exits 1 when
anything failed. ``--only`` takes notebook name prefixes (``03`` picks ``03_*.ipynb``, not
``03b_*``) and, for the server tests, the same words joined with ``or`` into ``pytest -k``.
The book's copies in ``build/executed/`` are left alone (``LAB_BOOK_CAPTURE=0``).
The hogs stop themselves after ``--hog-limit-s`` and are stopped by PID when the hunt ends.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab_backends.paths import lesson_notebooks  # noqa: E402

#: The nbval flags of ``make test``'s notebook stage when it cannot make a class (not root): the hunt runs the
#: lessons beside its hogs, not as sandboxed learners (``sandboxed_lessons.PLAIN_FLAGS``, which
#: tests/test_flake_hunt.py compares; not imported: the class's modules need JupyterHub, the hunt does not).
NBVAL_FLAGS = ["-n", "3", "--dist", "loadfile", "--nbval-lax",
               f"--nbval-sanitize-with={ROOT / 'tests' / 'nbval_sanitize.cfg'}", "--nbval-cell-timeout=120"]
#: The marker of the tests that start a real tritonserver (pyproject.toml).
SERVER_MARKER = "server"
#: How ``make test`` spreads them: three workers, each test file on one (its module's server stays shared).
SERVER_FLAGS = ["-n", "3", "--dist", "loadfile"]
KINDS = {"notebooks": "notebook-cell", "server-tests": "test", "make-test": "make-test"}
MESSAGE_CHARS = 300


@dataclass
class Outcome:
    """One notebook cell or test in one round: a CSV row."""

    round: int
    kind: str
    item: str
    outcome: str
    duration_s: float
    hog: int
    started_utc: str
    message: str = ""


@dataclass
class RoundInfo:
    """One pytest run: when, how long, how loaded the machine was when it started."""

    round: int
    kind: str
    started_utc: str
    loadavg: tuple[float, float, float]
    wall_s: float = 0.0
    returncode: int = 0


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def select_notebooks(prefixes: list[str] | None) -> list[str]:
    """The lesson notebooks (relative paths) whose name starts with ``<prefix>_``; all when none given."""
    notebooks = lesson_notebooks()
    if prefixes:
        notebooks = [nb for nb in notebooks if any(nb.name.startswith(p + "_") for p in prefixes)]
    return [str(nb.relative_to(ROOT)) for nb in notebooks]


def notebook_command(notebooks: list[str] | None, junit: Path) -> list[str]:
    """``make test``'s nbval line, on the given notebooks (the whole folder when None)."""
    return [sys.executable, "-m", "pytest", *NBVAL_FLAGS, *(notebooks or ["notebooks"]),
            "-p", "no:cacheprovider", f"--junitxml={junit}"]


def server_test_command(only: list[str] | None, junit: Path) -> list[str]:
    """The tests marked ``server``, narrowed by ``-k`` when ``only`` is given."""
    select = ["-k", " or ".join(only)] if only else []
    return [sys.executable, "-m", "pytest", "-m", SERVER_MARKER, *SERVER_FLAGS, *select, "tests",
            "-p", "no:cacheprovider", f"--junitxml={junit}"]


def item_name(classname: str, name: str, root: Path = ROOT) -> str:
    """The pytest node id back from junit's dotted classname: ``notebooks/03b_x.ipynb::Cell 9``."""
    if classname.endswith(".ipynb"):
        return classname[: -len(".ipynb")].replace(".", "/") + ".ipynb::" + name
    parts = classname.split(".")
    for end in range(1, len(parts) + 1):
        module = "/".join(parts[:end]) + ".py"
        if (root / module).is_file():
            return "::".join([module, *parts[end:], name])
    return f"{classname}::{name}" if classname else name


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:MESSAGE_CHARS] if lines else ""


def parse_junit(path: Path, round_no: int, kind: str, hog: int, started_utc: str) -> list[Outcome]:
    """Every testcase in a junit XML file as an Outcome (failure beats error beats skipped)."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome, message = label, first_line(element.get("message") or element.text)
                break
        rows.append(Outcome(round_no, kind, item_name(case.get("classname", ""), case.get("name", "")),
                            outcome, float(case.get("time") or 0.0), hog, started_utc, message))
    return rows


def hog_command(limit_s: float, parent_pid: int | None = None) -> list[str]:
    """A child Python that busy-loops one core until SIGALRM ends it after ``limit_s`` (at least 1 s),
    or until ``parent_pid`` (default: this hunt) is no longer its parent: a killed hunt leaves no hog.

    The parent's PID is an argument, not read by the hog at start: a parent that died before the
    hog's first line would otherwise look alive forever.
    """
    code = (f"import os, signal, sys\nsignal.alarm({max(1, math.ceil(limit_s))})\nparent = int(sys.argv[1])\n"
            "while os.getppid() == parent:\n    for _ in range(1_000_000):\n        pass\n")
    return [sys.executable, "-c", code, str(os.getpid() if parent_pid is None else parent_pid)]


@contextmanager
def cpu_hogs(count: int, limit_s: float) -> Iterator[list[subprocess.Popen]]:
    """``count`` bounded busy loops for the duration of the block, each stopped by its PID afterwards."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen(hog_command(limit_s), stdin=subprocess.DEVNULL))
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_make_test(round_no: int, hog: int, cwd: Path) -> tuple[RoundInfo, list[Outcome]]:
    """``make test`` in ``cwd`` (e.g. a fresh clone: set-up included), as CI runs it: one row, its wall time."""
    info = RoundInfo(round_no, KINDS["make-test"], utc_now(), os.getloadavg())
    print(f"\n=== flake hunt: round {round_no} make test in {cwd} (hog {hog}) ===", flush=True)
    start = time.monotonic()
    info.returncode = subprocess.run(["make", "test"], cwd=cwd, check=False).returncode
    info.wall_s = round(time.monotonic() - start, 2)
    outcome = "passed" if info.returncode == 0 else "failed"
    return info, [Outcome(round_no, info.kind, f"make test ({cwd})", outcome, info.wall_s, hog, info.started_utc,
                          "" if outcome == "passed" else f"make test exited {info.returncode}")]


def run_round(round_no: int, what: str, only: list[str] | None, hog: int, tmp: Path) -> tuple[RoundInfo, list[Outcome]]:
    """One pytest run of one suite; a run that leaves no junit XML (or exits oddly) becomes an error row."""
    kind = KINDS[what]
    junit = tmp / f"round-{round_no}-{what}.xml"
    if what == "notebooks":
        cmd = notebook_command(select_notebooks(only) if only else None, junit)
    else:
        cmd = server_test_command(only, junit)
    info = RoundInfo(round_no, kind, utc_now(), os.getloadavg())
    print(f"\n=== flake hunt: round {round_no} {what} (hog {hog}, load {info.loadavg[0]:.2f}) ===", flush=True)
    print(" ".join(cmd), flush=True)
    env = {**os.environ, "LAB_BOOK_CAPTURE": "0"}  # leave the book's build/executed/ copies alone
    if what == "notebooks":
        env["LAB_FORCE_REMEASURE"] = "1"  # as make test runs them: every claim's fallback runs too
    start = time.monotonic()
    info.returncode = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    info.wall_s = round(time.monotonic() - start, 2)
    rows = parse_junit(junit, round_no, kind, hog, info.started_utc) if junit.is_file() else []
    if info.returncode not in (0, 1) or not rows:
        rows.append(Outcome(round_no, kind, f"<pytest {what}>", "error", info.wall_s, hog, info.started_utc,
                            f"pytest exited {info.returncode} with {len(rows)} items in its junit XML"))
    return info, rows


def write_csv(rows: list[Outcome], path: Path, append: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = not (append and path.is_file() and path.stat().st_size > 0)
    with path.open("a" if append else "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[f.name for f in fields(Outcome)])
        if header:
            writer.writeheader()
        writer.writerows(asdict(row) for row in rows)


def failure_counts(rows: list[Outcome]) -> list[tuple[str, int, int, str]]:
    """(item, rounds failed, rounds run, first failure message) for every item that failed at least once."""
    runs: dict[str, set[int]] = {}
    failed: dict[str, set[int]] = {}
    first: dict[str, str] = {}
    for row in rows:
        runs.setdefault(row.item, set()).add(row.round)
        if row.outcome in ("failed", "error"):
            failed.setdefault(row.item, set()).add(row.round)
            first.setdefault(row.item, row.message)
    return sorted(((item, len(failed[item]), len(runs[item]), first[item]) for item in failed),
                  key=lambda entry: (-entry[1], entry[0]))


def slowest(rows: list[Outcome], count: int = 10) -> list[tuple[str, float]]:
    """The ``count`` items with the longest single duration: (item, max seconds)."""
    longest: dict[str, float] = {}
    for row in rows:
        longest[row.item] = max(longest.get(row.item, 0.0), row.duration_s)
    return sorted(longest.items(), key=lambda entry: -entry[1])[:count]


def summary(rounds: list[RoundInfo], rows: list[Outcome], hog: int) -> str:
    """The markdown summary: rounds, load, failures per item, slowest items."""
    lines = [f"# Flake hunt ({utc_now()})", "",
             f"{len({r.round for r in rounds})} round(s), {len(rounds)} pytest run(s), hog {hog}, "
             f"{len({r.item for r in rows})} items, {len(rows)} outcomes, {os.cpu_count()} CPUs.", "",
             "| round | suite | started (UTC) | wall s | load 1/5/15 at start | pytest rc |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.round} | {r.kind} | {r.started_utc} | {r.wall_s:.1f} | "
              f"{' / '.join(f'{x:.2f}' for x in r.loadavg)} | {r.returncode} |" for r in rounds]
    failures = failure_counts(rows)
    lines += ["", "## Failures", ""]
    if failures:
        lines += ["| item | failed | first message |", "|---|---|---|"]
        lines += [f"| {item} | {k} of {n} | {msg.replace('|', '/')} |" for item, k, n, msg in failures]
    else:
        lines.append("None: every item passed (or skipped) in every round.")
    lines += ["", "## Slowest 10 (max duration over rounds)", "", "| item | max s |", "|---|---|"]
    lines += [f"| {item} | {seconds:.2f} |" for item, seconds in slowest(rows)]
    return "\n".join(lines) + "\n"


def summary_path(csv_path: Path) -> Path:
    return csv_path.with_name(csv_path.stem + "_summary.md")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="how many times to run each suite (default 5)")
    parser.add_argument("--hog", type=int, default=0, help="busy-loop processes kept running (default 0)")
    parser.add_argument("--hog-limit-s", type=float, default=3 * 3600,
                        help="each hog exits by itself after this many seconds (default 3 h)")
    parser.add_argument("--what", choices=["notebooks", "server-tests", "both", "make-test"], default="notebooks",
                        help="make-test: the whole `make test` in --cwd (a fresh clone), one row per round")
    parser.add_argument("--cwd", type=Path, default=ROOT, help="where --what make-test runs (default: this checkout)")
    parser.add_argument("--only", nargs="+", metavar="PATTERN",
                        help="notebook name prefixes (03 -> 03_*.ipynb); for server tests, joined into -k")
    parser.add_argument("--csv", type=Path, default=ROOT / "bench" / "flakes.csv")
    parser.add_argument("--append", action="store_true", help="append to the CSV instead of overwriting it")
    parser.add_argument("--stop-on-fail", action="store_true", help="stop after the first round with a failure")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.hog < 0:
        parser.error("--rounds must be at least 1 and --hog at least 0")
    if args.what in ("notebooks", "both") and args.only and not select_notebooks(args.only):
        parser.error(f"--only {' '.join(args.only)} matches no notebook in notebooks/")
    return args


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: the hogs are stopped by PID


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    suites = ["notebooks", "server-tests"] if args.what == "both" else [args.what]
    rounds: list[RoundInfo] = []
    rows: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="flake-hunt-") as tmp, cpu_hogs(args.hog, args.hog_limit_s):
        for round_no in range(1, args.rounds + 1):
            for what in suites:
                if what == "make-test":
                    info, found = run_make_test(round_no, args.hog, args.cwd)
                else:
                    info, found = run_round(round_no, what, args.only, args.hog, Path(tmp))
                rounds.append(info)
                rows += found
            if args.stop_on_fail and failure_counts(rows):
                break
    write_csv(rows, args.csv, args.append)
    text = summary(rounds, rows, args.hog)
    summary_path(args.csv).write_text(text)
    print("\n" + text + f"\nCSV: {args.csv}\nsummary: {summary_path(args.csv)}")
    return 1 if failure_counts(rows) or any(r.returncode != 0 for r in rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
