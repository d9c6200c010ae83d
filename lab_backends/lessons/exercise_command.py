"""``lab-backends exercises ...``: the audit of every checker, and a fresh C skeleton for a learner.

Kept out of ``cli.py`` so that the entry point stays one line per command family. ``audit`` imports
the checkers when it runs (they bring pandas and the measure layer); ``reset`` needs only
:mod:`lab_backends.lessons.handout`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab_backends.lessons import handout


def add_exercises_parser(sub: argparse._SubParsersAction) -> None:
    exercises = sub.add_parser("exercises", help="check the exercises' checkers (audit)")
    exercises.add_argument(
        "action", choices=["audit", "reset"],
        help="audit: skeleton, reference, wrong and alternative answers; reset NAME: a fresh C skeleton "
        "in your notebooks' exercises/ (yours kept as .bak)"
    )
    exercises.add_argument("names", nargs="*", metavar="NAME", help="reset: the exercise(s) whose file to hand out")
    exercises.add_argument("--notebooks", type=Path, metavar="DIR",
                           help="reset: the notebooks folder whose exercises/ to reset (default: the one here: "
                           "./exercises, ./notebooks/exercises, else the project's)")
    exercises.add_argument("--only", action="append", metavar="NAME", help="audit only this exercise (repeatable)")
    exercises.add_argument("--jobs", type=int, default=1,
                           help="worker processes (make test uses 3: the checkers mostly wait on servers)")
    exercises.add_argument("--record", type=Path, metavar="FILE",
                           help="audit: write every answer's verdict on both paths to FILE (JSON; make test "
                           "writes test-artifacts/audit.json and tests/check_audit.py reads it)")
    exercises.set_defaults(func=_exercises)


def _exercises(args: argparse.Namespace) -> int:
    """``exercises audit``: exit 1 when any exercise falls short (its lines say how); ``exercises reset NAME``."""
    if args.action == "reset":
        return _reset_exercises(args.names, args.notebooks or handout.notebooks_for(Path.cwd()))
    # Deferred: the checkers import pandas and the measure layer (~0.5 s) that `reset` and --help need not pay.
    from lab_backends.lessons.exercises import EXERCISES
    from lab_backends.lessons.exercises.audit import audit, record

    unknown = sorted(set(args.only or ()) - set(EXERCISES))
    if unknown:
        print(f"error: no exercise named {', '.join(unknown)}; known: {', '.join(sorted(EXERCISES))}",
              file=sys.stderr)
        return 2
    verdicts = audit(args.only or None, emit=lambda line: print(line, flush=True), jobs=args.jobs)
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record(verdicts), indent=1, ensure_ascii=False))
    times = ", ".join(f"{v.name} {v.seconds:.0f} s" for v in sorted(verdicts, key=lambda v: -v.seconds))
    print(f"audit time: {sum(v.seconds for v in verdicts):.0f} s ({times})", file=sys.stderr)
    short = [v.name for v in verdicts if not v.ok]
    if short:
        print(f"{len(short)} of {len(verdicts)} exercises fall short: {', '.join(short)}", file=sys.stderr)
    return 1 if short else 0


def _reset_exercises(names: list[str], notebooks: Path) -> int:
    """A fresh skeleton for each C exercise named, in ``notebooks``; the learner's file is kept as a ``.bak``."""
    if not names:
        print("error: name the exercise to reset, e.g. `lab-backends exercises reset clip_backend`; the ones with a "
              f"file: {', '.join(h.exercise for h in handout.HANDOUTS)}", file=sys.stderr)
        return 2
    for name in names:
        try:
            fresh, kept = handout.reset(name, notebooks)
        except OSError as exc:
            print(f"error: cannot reset {name} in {_shown(notebooks)}: {exc.strerror} ({exc.filename}); run it in "
                  "your notebooks folder (or above it), or name it with --notebooks DIR", file=sys.stderr)
            return 1
        print(f"{_shown(fresh)}: the skeleton as shipped" + (f"; your file is now {_shown(kept)}" if kept else ""))
    return 0


def _shown(path: Path) -> str:
    """``path`` relative to here when it is below here (a learner's ~/notebooks is not below the project)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
