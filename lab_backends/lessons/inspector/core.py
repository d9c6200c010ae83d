"""Send the learner's drawing once (or in a burst) and collect what the SERVER says about it.

:func:`inspect` is the whole experiment without any widget, so notebooks, tests and the panel share
it: statistics snapshot, the learner's request on the wire (plus ``burst - 1`` copies sent at the
same moment over gRPC, to give the batcher company), a second snapshot, then the trace file read
back for exactly these request ids. Every figure in the returned :class:`Inspection` names its
source in :attr:`Inspection.sources`.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lab_backends.client.infer import make_inputs
from lab_backends.errors import ProtocolError
from lab_backends.measure import stats, trace
from lab_backends.measure.stats import ServerWindow
from lab_backends.measure.trace import TraceLog

from . import evidence
from .exchange import InputFit, Sent, class_scores, fit_input, live_config, send
from .pad import GRID

#: Largest burst the panel may send (a bounded loop: one slider, one machine of 2 cores).
MAX_BURST = 32
_COUNTER = itertools.count(1)
_TAG = uuid.uuid4().hex[:4]


@dataclass
class Inspection:
    """Everything known about one sent request, each part from the server."""

    model: str
    protocol: str
    request_id: str
    burst_ids: list[str]
    fit: InputFit
    sent: Sent
    scores: np.ndarray
    predicted: int
    log: TraceLog
    executions: pd.DataFrame
    window: ServerWindow
    instance: str
    sources: dict[str, str] = field(default_factory=dict)
    #: The model's ``platform`` from its live config (``"ensemble"`` for an ensemble, else e.g. ``""``).
    platform: str = ""

    @property
    def batch_size(self) -> int:
        """The largest batch that any execution of this request ran in (from the trace)."""
        return evidence.learner_batch(self.executions)

    @property
    def root(self) -> pd.Series:
        return self.log.request(self.request_id)

    @property
    def stages(self) -> pd.DataFrame:
        """The waterfall of this request: its own stages and its children's."""
        root = self.root
        own = self.log.stages[self.log.stages["trace_id"] == int(root["trace_id"])]
        return pd.concat([own, self.log.family(int(root["trace_id"]))]).drop_duplicates()

    @property
    def shared_with(self) -> list[str]:
        """Every other request that shared an execution with this one (in any step)."""
        return sorted({r for s in self.executions["shared_with"] for r in s})

    def summary(self) -> str:
        shared = evidence.shared_text(self.shared_with)
        return (
            f"{self.model} answered {self.predicted} over {self.protocol} in {self.sent.latency_ms:.1f} ms "
            f"(server trace: {float(self.root['total_ms']):.2f} ms); largest batch {self.batch_size} "
            f"(shared with {shared}); request {self.sent.request_bytes} B, response {self.sent.response_bytes} B"
        )


def new_request_id() -> str:
    """A request id unique to this process, so old traces in a long-lived file never get mixed in."""
    return f"inspect-{_TAG}-{next(_COUNTER)}"


def _fire_copies(server: Any, model: str, fit: InputFit, ids: list[str]) -> tuple[threading.Semaphore, list[str]]:
    """Start the burst's copies over gRPC without waiting (tritonclient's async_infer)."""
    done, errors = threading.Semaphore(0), []

    def finished(result: Any, error: Any) -> None:  # tritonclient passes both by keyword
        if error is not None:
            errors.append(str(error))
        done.release()

    for rid in ids:
        server.grpc_client.async_infer(model, make_inputs({fit.name: fit.tensor}), finished, request_id=rid)
    return done, errors


def _refuse_bad_input(image: np.ndarray, burst: int) -> None:
    if image.shape == (GRID, GRID) and not image.any():
        raise ProtocolError("the pad is blank: draw a digit (or pick one from the test set) before sending")
    if not 1 <= int(burst) <= MAX_BURST:
        raise ProtocolError(f"a burst of {burst} is out of range: send 1..{MAX_BURST} copies")


def _send_with_copies(server: Any, model: str, fit: InputFit, protocol: str, rid: str, copies: list[str]) -> Sent:
    """The learner's request by ``protocol`` while its ``copies`` fly over gRPC; every copy waited for."""
    done, errors = _fire_copies(server, model, fit, copies)
    try:
        sent = send(server, model, fit, protocol, rid)
    finally:
        deadline = time.monotonic() + 60
        for _ in copies:
            done.acquire(timeout=max(0.0, deadline - time.monotonic()))
    if errors:
        raise ProtocolError(f"{len(errors)} of the burst's {len(copies)} copies failed, e.g.: {errors[0][:300]}")
    return sent


def _sources(model: str, protocol: str, rid: str, trace_name: str, sent: Sent, fit: InputFit,
             score_source: str, copies: list[str]) -> dict[str, str]:
    """Where each figure of an :class:`Inspection` comes from, in words the panel shows."""
    front = "REST" if protocol.startswith("REST") else "gRPC"
    return {
        "wire": f"the bytes this process sent and received over {front} ({sent.request_bytes} B out, "
        f"{sent.response_bytes} B back)",
        "answer": score_source,
        "waterfall": f"the server's trace file {trace_name}* (records with request_id {rid!r} and their children)",
        "batch": "the trace: requests of one model with identical COMPUTE_START/COMPUTE_END stamps "
        "ran in one execution",
        "instance": "the model's live config (instance_group); the trace does not name instances",
        "statistics": f"GET /v2/models/{model}/stats before and after this send (delta)",
        "input": fit.how,
        "burst": (
            f"{len(copies)} copies of the same tensor sent over gRPC at the same moment as yours"
            if copies
            else "none: your request went alone"
        ),
    }


def inspect(
    server: Any,
    model: str,
    image: np.ndarray,
    protocol: str = "gRPC",
    burst: int = 1,
    request_id: str | None = None,
    trace_timeout_s: float = 20.0,
) -> Inspection:
    """Send ``image`` to ``model`` by ``protocol`` (``burst`` copies at once) and gather the evidence.

    Raises :class:`ProtocolError` for a blank drawing, a model whose input the drawing cannot fill,
    or a refused request; :class:`~lab_backends.errors.TraceError` when the server has no trace file;
    :class:`~lab_backends.errors.StatisticsError` when the model is not loaded.
    """
    image = np.asarray(image)
    _refuse_bad_input(image, burst)
    path = trace.trace_path(server)  # fails early, with how to fix it, on an untraced server
    before = stats.settled_statistics(server, model)  # also fails early if the model is not loaded
    config = live_config(server, model)
    fit = fit_input(config, image)
    rid = request_id or new_request_id()
    copies = [f"{rid}-copy{i}" for i in range(1, int(burst))]
    sent = _send_with_copies(server, model, fit, protocol, rid, copies)
    stats.rows_since(server, model, stats.totals(before, model).inferences, int(burst))
    after = stats.settled_statistics(server, model)
    log = trace.read_trace(path, request_ids=[rid, *copies], timeout_s=trace_timeout_s).select([rid, *copies])
    scores, predicted, score_source = class_scores(sent.outputs)
    execs = evidence.executions(log, rid)
    execs["instance"] = [evidence.instance_name(live_config(server, m)) for m in execs["model"]]
    return Inspection(
        model=model, protocol=protocol, request_id=rid, burst_ids=copies, fit=fit, sent=sent, scores=scores,
        predicted=predicted, log=log, executions=execs, window=stats.window(before, after, model),
        instance=evidence.instance_of(config),
        sources=_sources(model, protocol, rid, path.name, sent, fit, score_source, copies),
        platform=config.platform,
    )
