"""Notebook 08b: continuous (iterative) batching against static batching, from the model's own records.

Two models serve the same character model (``generate_static``: a whole batch generated in one
execution; ``generate_iterative``: one step per execution, unfinished requests released with
RESCHEDULE). Every streamed token carries the model's record of its step: EXEC, STEP, BATCH
(:mod:`lab_backends.measure.generation`). This module arranges the experiments a lesson shows:

* :func:`late_arrival`: a long request starts; once the model's records show it has produced
  ``after`` tokens, a short one is sent. Iterative scheduling runs the short one's steps IN the long
  one's executions; static batching runs it in a later execution, after the long one's last token.
  The arrival is arranged by the records, not by a sleep: the evidence does not depend on timing.
* what a release does to a sequence slot when the client cancels, and what the statistics count
  for an iterative model: :mod:`.continuous_release`.
* :func:`reference_texts`: what greedy decoding must produce, computed in-process with the weights.
* :func:`server_steps`: the SERVER's own record of the same thing, from its trace: a rescheduled
  request keeps one trace, which gains a ``QUEUE_START`` and a ``COMPUTE_START``/``COMPUTE_END``
  for every step (measured here on 2.51); a statically batched request has one of each.
* plots: the timeline (each request's tokens over time, coloured by execution), the execution grid
  (which step of which request ran in which execution) and time to first token / latency by length.

Deferred import: matplotlib (~1 s), only when a figure is drawn.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from lab_backends.charlm import ARTIFACT, generate, load_weights
from lab_backends.errors import TraceError
from lab_backends.measure.generation import DEFAULT_PROMPT, Ask, GenerationRun, run_streams
from lab_backends.measure.trace_records import read_records
from lab_backends.notebook import measure_rounds
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll

LONG, SHORT = "long", "short"


@dataclass
class Admission:
    """A short request sent while a long one was generating, and where the model ran its steps."""

    model: str
    run: GenerationRun
    after: int  # the long request had received this many tokens when the short one was sent
    long: str = LONG  # the requests' ids
    short: str = SHORT

    @property
    def shared(self) -> set[int]:
        """Executions in which a step of the short request ran beside a step of the long one."""
        return self.run.shared_executions(self.long, self.short)

    @property
    def joined_while_generating(self) -> bool:
        """Every step of the short request ran in one of the long one's executions, and it left first (continuous)."""
        long, short = self.run[self.long], self.run[self.short]
        return (len(self.shared) == short.ask.max_tokens and min(short.executions) > min(long.executions)
                and max(short.executions) < max(long.executions))

    @property
    def waited_for_whole_batch(self) -> bool:
        """Every step of the short request ran in an execution after the long one's last (static batching)."""
        long, short = self.run[self.long], self.run[self.short]
        return not self.shared and min(short.executions) > max(long.executions)

    def grid(self) -> pd.DataFrame:
        """Rows: executions; columns: the two requests; cells: the step each ran there (blank: none)."""
        steps = self.run.timeline()
        grid = steps.pivot_table(index="execution", columns="request", values="step", aggfunc="first")
        return grid.reindex(columns=[self.long, self.short]).astype("Int64")

    def summary(self) -> str:
        long, short = self.run[self.long], self.run[self.short]
        return (f"{self.model}: long ({long.ask.max_tokens} tokens) in executions {min(long.executions)}-"
                f"{max(long.executions)}; short ({short.ask.max_tokens} tokens, sent after the long one's "
                f"{self.after} tokens) in {min(short.executions)}-{max(short.executions)}; "
                f"{len(self.shared)} shared; short's first token {short.ttft_s * 1000:.0f} ms after it was sent")


def late_arrival(server: RunningServer, model: str, long_tokens: int = 40, short_tokens: int = 4,
                 after: int = 2, timeout_s: float = 30.0, tag: str = "") -> Admission:
    """Start a long request; send a short one once the long one has received ``after`` tokens.

    ``tag`` is appended to the request ids (``long-<tag>``): distinct ids keep runs apart in a trace.
    """
    if not 1 <= after < long_tokens - short_tokens:
        raise ValueError("send the short request while the long one still has more steps to run than it needs")
    long, short = (f"{name}-{tag}" if tag else name for name in (LONG, SHORT))
    run = run_streams(server, model, [[Ask(long, long_tokens)], [Ask(short, short_tokens, after=(long, after))]],
                      timeout_s=timeout_s)
    return Admission(model, run, after, long, short)


def late_arrivals(server: RunningServer, models: Iterable[str], long_tokens: int = 40, short_tokens: int = 4,
                  after: int = 2) -> dict[str, Admission]:
    """:func:`late_arrival` on each model (tagged by the second word of its name); an iterative model's pair
    runs once more when its short request did not join (:func:`notebook.measure_rounds`, which
    ``LAB_FORCE_REMEASURE=1`` makes run every time in ``make test``).

    Why a re-measure: the short request is sent when the records show the long one's ``after``-th token,
    not after a sleep, but a client that the machine stalls for longer than the long one's remaining
    steps (~240 ms at 40 tokens) sends it after the long one ended, and it joins nothing. Each run has
    tags of its own, so the server's trace tells them apart.
    """
    runs: dict[str, Admission] = {}
    for model in models:
        tag = model.split("_")[1]
        first = late_arrival(server, model, long_tokens, short_tokens, after, tag=tag)
        if not server.model_config(model).sequence_batching.iterative_sequence:
            runs[model] = first  # static: the short request waits for the whole batch however late it comes
            continue
        again = iter(range(1, 3))
        rounds = measure_rounds(first, lambda seen: not seen.joined_while_generating,
                                lambda factor: late_arrival(server, model, long_tokens, short_tokens, after,
                                                            tag=f"{tag}-again{next(again)}"))
        runs[model] = rounds[-1]
    return runs


@dataclass
class ServerView:
    """The same late arrival in the server's trace: how often each request was computed, and when."""

    steps: pd.DataFrame  # server_steps() of the two requests
    long: str
    short: str

    def computes(self, request: str) -> int:
        return int((self.steps["request"] == request).sum())

    def _of(self, request: str) -> pd.DataFrame:
        return self.steps[self.steps["request"] == request]

    @property
    def short_in_long_computes(self) -> int:
        """Computes of the short request stamped with the very same COMPUTE_START as one of the long one's."""
        return int(self._of(self.short)["compute_start_ns"].isin(set(self._of(self.long)["compute_start_ns"])).sum())

    @property
    def short_started_after_long_ended(self) -> bool:
        return int(self._of(self.short)["compute_start_ns"].min()) >= int(self._of(self.long)["compute_end_ns"].max())


def server_view(admission: Admission, trace_file: str | Path, timeout_s: float = 10.0) -> ServerView:
    """Read the server's trace of a :func:`late_arrival` (the server needs trace_file, trace_log_frequency=1)."""
    steps = server_steps(trace_file, [admission.long, admission.short], timeout_s)
    return ServerView(steps, admission.long, admission.short)


def reference_texts(run: GenerationRun) -> dict[str, str]:
    """What greedy decoding with the trained weights produces for each request of ``run``, in-process."""
    weights = load_weights(ARTIFACT)
    return {g.ask.name: generate(weights, g.ask.prompt, g.ask.max_tokens) for g in run.generations}


def served_as_computed(run: GenerationRun) -> bool:
    """Every request received exactly the characters the in-process reference computes."""
    expected = reference_texts(run)
    return all(g.text == expected[g.ask.name] for g in run.generations)


def _trace_steps(records: list[dict], wanted: set[str]) -> pd.DataFrame:
    names: dict[int, str] = {}
    stamps: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if record.get("request_id") in wanted and "parent_id" not in record:
            names[record["id"]] = record["request_id"]
        for stamp in record.get("timestamps", []):
            stamps[record["id"]][stamp["name"]].append(int(stamp["ns"]))
    rows = []
    for trace_id, request in names.items():
        got = {k: sorted(v) for k, v in stamps[trace_id].items()}
        if not got.get("REQUEST_END"):
            continue  # not complete yet
        for k, (queued, start, end) in enumerate(zip(got["QUEUE_START"], got["COMPUTE_START"], got["COMPUTE_END"])):
            rows.append({"request": request, "k": k, "queue_start_ns": queued, "compute_start_ns": start,
                         "compute_end_ns": end})
    return pd.DataFrame(rows, columns=["request", "k", "queue_start_ns", "compute_start_ns", "compute_end_ns"])


def server_steps(trace_file: str | Path, requests: Iterable[str], timeout_s: float = 10.0) -> pd.DataFrame:
    """The server's trace of ``requests``: one row per time each was queued and computed (``k``-th).

    Needs a server started with ``trace_file=...`` and ``trace_log_frequency=1`` (each trace is written
    once its request has ended, a moment after the client saw the FINAL flag: hence the bounded wait).
    """
    wanted = set(requests)

    def look() -> pd.DataFrame:
        try:
            return _trace_steps(read_records(trace_file), wanted)
        except TraceError:
            return _trace_steps([], wanted)

    frame = poll(look, lambda f: set(f["request"]) >= wanted, timeout_s, 0.1)
    if not set(frame["request"]) >= wanted:
        missing = sorted(wanted - set(frame["request"]))
        raise TraceError(f"the trace at {trace_file} has no complete record of {missing} after {timeout_s:g} s: "
                         "was the server started with trace_file=... and trace_log_frequency=1?")
    return frame.sort_values(["request", "k"], ignore_index=True)


def per_request(runs: dict[str, GenerationRun]) -> pd.DataFrame:
    """Both runs' request tables, one row per (model, request), sorted by length."""
    frames = [run.requests().assign(model=name) for name, run in runs.items()]
    cols = ["model", "request", "max_tokens", "ttft_ms", "latency_ms", "tokens_per_s", "first_exec", "last_exec"]
    return pd.concat(frames, ignore_index=True)[cols].sort_values(["model", "max_tokens", "request"])


# ------------------------------------------------------------------------------------ figures


def plot_grid(admission: Admission, ax: Any = None) -> Any:
    """Which step of which request ran in which execution: one row per request, one column per execution."""
    import matplotlib.pyplot as plt

    grid = admission.grid()
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1.6))
    cells = grid.T.to_numpy(dtype=float, na_value=np.nan)
    ax.imshow(np.where(np.isnan(cells), 0, 1), aspect="auto", cmap="Greys", vmin=0, vmax=2,
              extent=(grid.index.min() - 0.5, grid.index.max() + 0.5, len(grid.columns) - 0.5, -0.5))
    for row, name in enumerate(grid.columns):
        for execution, step in grid[name].dropna().items():
            ax.text(execution, row, str(step), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(grid.columns)), list(grid.columns))
    ax.set_xlabel("execution (the model's counter)")
    ax.set_title(f"{admission.model}: the step each request ran in each execution")
    return ax


def plot_timeline(runs: dict[str, GenerationRun], max_requests: int = 32) -> Any:
    """Each request's life over time: waiting (thin line), then its tokens coloured by the execution that made them."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 5), sharex=True, squeeze=False)
    for ax, (name, run) in zip(axes[0], runs.items()):
        gens = sorted(run.generations, key=lambda g: g.sent_s)[:max_requests]
        for row, g in enumerate(gens):
            if not g.tokens:
                continue
            ax.plot([g.sent_s * 1000, g.tokens[0].t_s * 1000], [row, row], color="0.7", lw=1)
            ax.scatter([t.t_s * 1000 for t in g.tokens], [row] * len(g.tokens), s=6,
                       c=[t.execution % 10 for t in g.tokens], cmap="tab10", vmin=0, vmax=9)
        ax.set_yticks(range(len(gens)), [f"{g.ask.name} ({g.ask.max_tokens})" for g in gens], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms since the first request")
        ax.set_title(f"{name}: grey = waiting for a first token")
    fig.tight_layout()
    return fig


def plot_latency(runs: dict[str, GenerationRun]) -> Any:
    """Time to first token and latency per request against its length, one marker per model."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for marker, (name, run) in zip("os^", runs.items()):
        table = run.requests()
        left.scatter(table["max_tokens"], table["ttft_ms"], marker=marker, label=name, alpha=0.7)
        right.scatter(table["max_tokens"], table["latency_ms"], marker=marker, label=name, alpha=0.7)
    left.set(xlabel="tokens asked", ylabel="ms", title="time to first token")
    right.set(xlabel="tokens asked", ylabel="ms", title="latency (sent to FINAL)")
    left.legend()
    fig.tight_layout()
    return fig


__all__ = ["DEFAULT_PROMPT", "Admission", "ServerView", "late_arrival", "per_request", "plot_grid", "plot_latency",
           "plot_timeline", "reference_texts", "served_as_computed", "server_steps", "server_view"]
