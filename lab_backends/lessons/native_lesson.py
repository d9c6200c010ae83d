"""Notebook 09c: a framework's own runtime behind the backend C API, beside the same framework wrapped
by the Python backend, on ONE server.

Each framework is served twice from the same file (the digits MLP, its trained weights):

* **Python-wrapped** (``digits_tf``, ``digits_torch``): the Python backend (a C++ library in the
  server) hands each batch to a *stub* process through shared memory; ``model.py`` calls the
  framework there;
* **native** (``digits_tf_native`` on our C backend ``lab_tensorflow``; ``digits_torch_native`` on
  our C++ backend ``lab_libtorch``): the framework's C/C++ runtime inside the server process, called
  from ``TRITONBACKEND_ModelInstanceExecute``.

What the lesson measures, one function each, all from one server started with no model loaded:

* :func:`load_one_by_one`: each model's load time, the server's RSS and thread growth while it
  loads and answers once, and its stub's RSS and threads (a native model has no stub: its framework
  is in the server's numbers);
* :func:`speed`: p50 at one request in flight and throughput at 16 in flight (dynamic batching, 2 ms
  delay, as configured), with the server's own breakdown per request over the same window
  (queue, compute_input, compute_infer, compute_output). The Python backend stamps compute start just
  before it pushes the batch to the stub and compute end once the stub's reply is back (python_backend
  ``src/python_be.cc`` L1322-L1353 at r24.10), so its ``compute_infer`` holds the hand-off; the
  native backends stamp around the framework call alone;
* :func:`claims`: what the notebook asserts, each a ratio of two numbers of the same run (a machine
  twice as slow slows both sides), checked with :func:`lab_backends.notebook.check_claims`, which
  re-measures once on a miss and always under ``LAB_FORCE_REMEASURE=1``;
* :func:`thread_lines` and :func:`batching_lines`: the sentences the notebook prints about the threads a
  model adds to the server and about what batching did to the gap, computed from this run's numbers.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import psutil

from lab_backends.client.infer import infer
from lab_backends.digits import load_split, normalize
from lab_backends.errors import LabBackendsError
from lab_backends.lessons import framework_costs
from lab_backends.lessons.c_source import strip_comments
from lab_backends.measure import loadgen
from lab_backends.notebook import Claim, sized
from lab_backends.paths import BACKEND_DIR, MODEL_REPOSITORY
from lab_backends.server.cbackend import library_path
from lab_backends.server.repository import read_config
from lab_backends.server.running import RunningServer

TORCH_NATIVE = "digits_torch_native"
#: The concurrencies compared: one request in flight (latency), sixteen (throughput with batching).
ALONE, BUSY = 1, 16
BREAKDOWN = ("queue_ms", "compute_input_ms", "compute_infer_ms", "compute_output_ms")


@dataclass(frozen=True)
class Pair:
    """One framework served twice: wrapped by the Python backend, and natively."""

    framework: str
    wrapped: str
    native: str


PAIRS = (Pair("tensorflow", "digits_tf", "digits_tf_native"), Pair("pytorch", "digits_torch", TORCH_NATIVE))


def pairs(repository: Path = MODEL_REPOSITORY, backend_dir: Path = BACKEND_DIR) -> list[Pair]:
    """Both frameworks, once their native backends are built (set-up builds them): a clear error if not."""
    for pair in PAIRS:
        backend = read_config(repository / pair.native).backend
        library = library_path(backend, backend_dir)
        if not library.is_file():
            raise LabBackendsError(f"{pair.native}: its backend {backend!r} is not built ({library} is missing); "
                                   "run `make setup` (or `.venv/bin/lab-backends setup`) in a terminal")
    return list(PAIRS)


def models_of(found: Sequence[Pair]) -> list[str]:
    return [m for p in found for m in (p.wrapped, p.native)]


def show_cpp(path: Path, name: str) -> str:
    """Print the C++ function ``name`` of ``path`` whole, with line numbers; its text.

    :func:`lab_backends.lessons.c_source.show` reads C; a C++ file's namespaces and templates defeat its
    parser, so this finds the definition (a line that declares ``name(`` and later opens a brace at
    depth 0 of the statement) and prints up to the matching brace, comments and strings ignored.
    """
    source = Path(path).read_text()
    code = strip_comments(source)
    for match in re.finditer(rf"^[A-Za-z_][^;{{}}()\n]*\b{re.escape(name)}\(", code, re.M):
        body = code.find("{", match.end())
        if body < 0 or ";" in code[match.end():body]:
            continue  # a declaration or a call, not the definition
        depth, end = 0, body
        for end in range(body, len(code)):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
        first = code.count("\n", 0, match.start()) + 1
        lines = source.splitlines()[first - 1:code.count("\n", 0, end) + 1]
        print(f"{Path(path).name}:{first}-{first + len(lines) - 1}")
        for number, line in enumerate(lines, first):
            print(f"{number:4d}  {line}")
        return "\n".join(lines)
    raise LabBackendsError(f"{Path(path).name} defines no function {name!r}")


def kind_of(model: str) -> str:
    return "native" if model.endswith("_native") else "python-wrapped"


def _pixels() -> np.ndarray:
    return normalize(load_split().test_images)


#: The name every thread of the server's own C++ code carries (it inherits the process's name).
SERVER_THREAD_NAME = "tritonserver"
#: Threads the server starts for ONE instance of a Python-backend model, read in python_backend's source
#: at r24.10 (``src/``); all start while the model loads (with core's two, 36: measured in 3 runs, 2026-12-04):
PYTHON_INSTANCE_THREADS = {
    # ModelInstanceState::LaunchStubProcess (L328): boost::asio::thread_pool(thread_pool_size) at
    # L339-340, whose threads start in its constructor; thread_pool_size is 32 (L1981) unless the server
    # runs with --backend-config=python,thread-pool-size=N (L2028-2040). Its only tasks are a decoupled
    # model's responses and BLS requests (L749-766): for digits_tf the 32 threads wait, idle.
    "the Python backend's per-instance thread pool (python_be.cc L339-340, size 32 by default: L1981)": 32,
    "its stub-to-parent message-queue monitor (python_be.cc L336, L1124-1129)": 1,
    "its stub launcher's MemoryManager queue monitor (stub_launcher.cc L177-178, memory_manager.cc L62)": 1,
}
#: Threads core starts for every model instance, whatever its backend (core ``src/`` at r24.10).
CORE_INSTANCE_THREADS = {
    "core's backend thread of the instance (backend_model_instance.cc L717, a CPU instance does not share one)": 1,
    "core's dynamic batcher thread (dynamic_batch_scheduler.cc L165-166)": 1,
}


def thread_names(pid: int) -> Counter:
    """How many threads of process ``pid`` carry each name (Linux ``/proc/<pid>/task/<tid>/comm``).

    Why names: the server's own threads are all called ``tritonserver`` (a thread inherits its
    creator's name), while TensorFlow names its pools (``tf_...``) and gRPC its own; so the names
    split what a model adds between the server's C++ code and the framework's runtime.
    """
    found: Counter = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[(task / "comm").read_text().strip()] += 1
        except OSError:  # the thread ended while we read
            continue
    return found


def _names_text(grown: Counter) -> str:
    return ", ".join(f"{count} {name}" for name, count in grown.most_common()) or "none"


def load_one_by_one(server: RunningServer, models: Sequence[str]) -> pd.DataFrame:
    """Load ``models`` one at a time into a server holding none of them; one row per model.

    ``server_mb``/``server_threads``: what the server process gained while the model loaded and
    answered one request (the first inference allocates); ``server_thread_names``: those new threads
    by name (:func:`thread_names`); ``stub_mb``/``stub_threads``: its stub process (0 for a native
    model: none exists); ``memory_mb``/``threads``: both together, what the model costs the machine.
    One at a time, so that each load has the machine to itself.
    """
    process = psutil.Process(server.pid)
    pixels = _pixels()[:4]
    rows = []
    for model in models:
        rss, threads, names_before = process.memory_info().rss, process.num_threads(), thread_names(server.pid)
        started = time.perf_counter()
        server.load_model(model)  # returns once READY; raises ModelLoadError with Triton's reason
        load_s = time.perf_counter() - started
        infer(server, model, {"PIXELS": pixels})
        stub = framework_costs.stub_footprint(server, [model]).loc[model]
        grown = thread_names(server.pid) - names_before
        rows.append({"model": model, "kind": kind_of(model), "load_s": load_s,
                     "server_mb": (process.memory_info().rss - rss) / 2**20,
                     "server_threads": process.num_threads() - threads,
                     "server_thread_names": _names_text(grown),
                     "server_threads_named_server": grown[SERVER_THREAD_NAME],
                     "stubs": int(stub["instances"]),
                     "stub_mb": 0.0 if stub["instances"] == 0 else float(stub["rss_mb_per_instance"]),
                     "stub_threads": 0.0 if stub["instances"] == 0 else float(stub["threads_per_instance"])})
    frame = pd.DataFrame(rows).set_index("model")
    frame["memory_mb"] = frame["server_mb"] + frame["stub_mb"]
    frame["threads"] = frame["server_threads"] + frame["stub_threads"]
    return frame


#: Each window: a bounded number of requests or seconds, whichever ends first (doubled on a re-measure).
WINDOW = {"requests": sized(300, 150), "duration_s": sized(1.5, 1.0)}


def speed(server: RunningServer, models: Sequence[str], factor: float = 1.0) -> pd.DataFrame:
    """Closed-loop windows, one request of 1 row each, for every model at ALONE and at BUSY in flight.

    Models alternate within each concurrency (a noisy neighbour hurts both sides alike). ``factor``
    stretches every window (a re-measurement runs the same experiment, longer).
    """
    x = _pixels()[:1]
    rows = []
    for concurrency in (ALONE, BUSY):
        for model in models:
            result = loadgen.run_closed(
                server, model, concurrency, inputs={"PIXELS": x}, outputs=["LOGITS"],
                requests=int(WINDOW["requests"] * factor), duration_s=WINDOW["duration_s"] * factor,
                warmup_requests=2 * concurrency, warmup_s=0.3)
            rows.append({"model": model, "kind": kind_of(model), "concurrency": concurrency, **result.row()})
    return pd.DataFrame(rows)


def _at(frame: pd.DataFrame, model: str, concurrency: int, column: str) -> float:
    row = frame[(frame["model"] == model) & (frame["concurrency"] == concurrency)]
    return float(row[column].iloc[0]) if len(row) else math.nan


def table(footprint: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per model: the footprint beside p50 at c=1, throughput at c=16 and the breakdown at c=1."""
    out = footprint[["kind", "load_s", "memory_mb", "server_mb", "stub_mb", "threads"]].copy()
    for model in out.index:
        out.loc[model, "p50_ms_c1"] = _at(measured, model, ALONE, "p50_ms")
        out.loc[model, f"rps_c{BUSY}"] = _at(measured, model, BUSY, "throughput_rps")
        out.loc[model, f"avg_batch_c{BUSY}"] = _at(measured, model, BUSY, "avg_batch")
        for part in BREAKDOWN:
            out.loc[model, f"{part}_c1"] = _at(measured, model, ALONE, f"server_{part}")
    return out


def ratio(measured: pd.DataFrame, pair: Pair, concurrency: int, column: str) -> float:
    """native / wrapped of one column at one concurrency, from one run."""
    return _at(measured, pair.native, concurrency, column) / _at(measured, pair.wrapped, concurrency, column)


#: Bounds of the claims, on ratios native / wrapped of the same run. Measured on this project's 2 cores
#: (2026-12-02, three windows quiet, one under nbval beside another notebook): compute_infer 0.49-0.51
#: for TensorFlow and 0.59-0.66 for PyTorch; p50 0.79-0.80 and 0.86-0.87 (the batcher's 2 ms delay,
#: the same on both sides, is in both p50s). A learner review's run on a busy machine measured
#: compute_infer 0.781 for TensorFlow, which passed a former bound of 0.8 by 2%: a near-miss is a flake
#: waiting. Both claims are now "smaller" (below 1): the quiet TensorFlow ratio may double, and the
#: busy one grow by 28%, before a miss; a miss re-measures once over a 2x longer window (check_claims)
#: before it fails. The lesson prints the ratios themselves from its own run.
INFER_RATIO_BELOW = 1.0
P50_RATIO_BELOW = 1.0


def claims(found: Sequence[Pair]) -> list[Claim]:
    """Per framework: the hand-off is gone from compute_infer, and one request alone is answered sooner."""
    out = []
    for pair in found:
        out.append(Claim(f"{pair.framework}: compute_infer per request at c=1, native / Python-wrapped (the stub "
                         "hand-off is gone)", lambda m, p=pair: ratio(m, p, ALONE, "server_compute_infer_ms"),
                         below=INFER_RATIO_BELOW, what="ratio"))
        out.append(Claim(f"{pair.framework}: p50 latency at c=1, native / Python-wrapped",
                         lambda m, p=pair: ratio(m, p, ALONE, "p50_ms"), below=P50_RATIO_BELOW, what="ratio"))
    return out


def thread_lines(footprint: pd.DataFrame, found: Sequence[Pair]) -> list[str]:
    """What each model added to the server's threads, by name, beside what the source says it starts.

    A Python-wrapped instance: :data:`PYTHON_INSTANCE_THREADS` plus :data:`CORE_INSTANCE_THREADS`; a
    native one: core's two plus whatever its framework starts (TensorFlow names its own ``tf_*``).
    """
    python, core = sum(PYTHON_INSTANCE_THREADS.values()), sum(CORE_INSTANCE_THREADS.values())
    lines = []
    for pair in found:
        for model in (pair.wrapped, pair.native):
            row = footprint.loc[model]
            source = (f"{python} from the Python backend + {core} from core" if row["stubs"] else
                      f"{core} from core, the rest the framework's")
            lines.append(f"{model}: the server gained {row['server_threads']:.0f} threads "
                         f"({row['server_thread_names']}); the source says {source}")
    lines.append("per Python-wrapped instance: " + "; ".join(
        f"{n} {what}" for what, n in {**PYTHON_INSTANCE_THREADS, **CORE_INSTANCE_THREADS}.items()))
    return lines


def batching_lines(summary: pd.DataFrame, found: Sequence[Pair]) -> list[str]:
    """Per framework: how far ahead native was alone (c=1) and with batching (c=16), and which way it went.

    Alone, the lead is how many times faster native answers (wrapped p50 / native p50); busy, how
    many times the requests per second (native / wrapped). "stayed about the same" when the two are within
    10% of each other: a closer difference is not read from one run of a shared machine.
    """
    lines = []
    for pair in found:
        w, n = summary.loc[pair.wrapped], summary.loc[pair.native]
        alone = w["p50_ms_c1"] / n["p50_ms_c1"]
        busy = n[f"rps_c{BUSY}"] / w[f"rps_c{BUSY}"]
        went = "grew" if busy > 1.1 * alone else "shrank" if busy < alone / 1.1 else "stayed about the same"
        lines.append(f"{pair.framework}: native is {alone:.2f}x as fast alone (p50 {n['p50_ms_c1']:.2f} vs "
                     f"{w['p50_ms_c1']:.2f} ms at c={ALONE}) and serves {busy:.2f}x the requests per second at "
                     f"c={BUSY} (average batch {n[f'avg_batch_c{BUSY}']:.1f} vs {w[f'avg_batch_c{BUSY}']:.1f}): "
                     f"with batching its lead {went}")
    return lines


def plot(summary: pd.DataFrame) -> Any:
    """Five panels (load, memory, threads, p50 at c=1, throughput at c=16) and the breakdown at c=1."""
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    names = list(summary.index)
    colours = ["tab:orange" if summary.loc[m, "kind"] == "native" else "tab:blue" for m in names]
    panels = (("load_s", "load time (s)"), ("memory_mb", "memory: server growth + stub RSS (MB)"),
              ("threads", "threads: server growth + stub"), ("p50_ms_c1", f"p50 at c={ALONE} (ms)"),
              (f"rps_c{BUSY}", f"throughput at c={BUSY} (req/s)"))
    for ax, (column, title) in zip(axes.flat, panels):
        ax.bar(names, summary[column], color=colours)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", rotation=25, labelsize=8)
    ax = axes.flat[5]
    bottom = np.zeros(len(names))
    for part in BREAKDOWN:
        values = summary[f"{part}_c1"].fillna(0).to_numpy()
        ax.bar(names, values, bottom=bottom, label=part.removesuffix("_ms"))
        bottom += values
    ax.set_title(f"server-side time per request at c={ALONE} (ms)", fontsize=10)
    ax.tick_params(axis="x", rotation=25, labelsize=8)
    ax.legend(fontsize=8)
    fig.suptitle("Python-wrapped (blue) vs native (orange), one server, one run")
    fig.tight_layout()
    return fig
