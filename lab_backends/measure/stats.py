"""The server's view of a load window: deltas of Triton's statistics API and Prometheus metrics.

The client sees only end-to-end latency. Triton counts, per model, how long requests waited in the
queue and how long the backend spent on inputs, on inference and on outputs, plus how many
executions ran at each batch size. Those counters are cumulative since the model was loaded, so a
*window* is the difference of two snapshots: one taken before the measured load and one after.

Everything below :func:`fetch_statistics` / :func:`scrape_metrics` is a pure function on payload
dicts or text, so the arithmetic is unit-tested on payloads recorded from a real server.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from lab_backends import rest
from lab_backends.errors import StatisticsError
from lab_backends.measure.pods import summed_metrics
from lab_backends.measure.prometheus import Metrics, metrics_delta, metrics_timeline, parse_metrics
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll, settled

#: The per-request duration counters of ``inference_stats`` that split server time by stage.
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")

# ---------------------------------------------------------------------------------------- fetching


def fetch_statistics(server: RunningServer, model: str = "", timeout_s: float = 10.0) -> dict:
    """``GET /v2/models/<model>/stats`` with the server's admin key (the API is restricted).

    The same path as ``server.statistics`` (over REST, from any thread; summed over the pods of a
    class server), kept under this name for the measuring code that reads it.
    """
    return server.statistics(model, timeout_s)


def scrape_metrics(server: RunningServer, timeout_s: float = 10.0) -> str:
    """The Prometheus text page (``/metrics``); it is not restricted."""
    if len(getattr(server, "endpoints", ())) > 1:  # a class server: every pod's page, summed
        return summed_metrics(server, timeout_s)
    status, body = rest.request(server.metrics_url, timeout=timeout_s)
    if status != 200:
        raise StatisticsError(f"the metrics page {server.metrics_url} answered HTTP {status}: {body[:200]!r}")
    return body.decode()


# ---------------------------------------------------------------------------- statistics arithmetic


def _int(value: Any) -> int:
    """Counters arrive as ints over HTTP and as strings when a gRPC message is turned into JSON."""
    return int(value or 0)


def _pair(entry: Mapping[str, Any] | None) -> tuple[int, int]:
    entry = entry or {}
    return _int(entry.get("count")), _int(entry.get("ns"))


def model_entries(payload: Mapping[str, Any], model: str, version: str | None = None) -> list[dict]:
    """The ``model_stats`` entries for ``model`` (every version unless one is named)."""
    entries = [
        e for e in payload.get("model_stats", [])
        if e.get("name") == model and (version is None or str(e.get("version")) == str(version))
    ]
    if not entries:
        names = sorted({e.get("name", "?") for e in payload.get("model_stats", [])})
        raise StatisticsError(
            f"no statistics for model '{model}'" + (f" version {version}" if version else "")
            + f" in this payload (it has: {', '.join(names) or 'nothing'}); is the model loaded?"
        )
    return entries


@dataclass
class Totals:
    """Cumulative counters of one model (summed over versions) at one instant."""

    inferences: int = 0
    executions: int = 0
    success: tuple[int, int] = (0, 0)
    fail: tuple[int, int] = (0, 0)
    stages: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: batch size -> (executions, total compute_infer ns) from ``batch_stats``.
    batches: dict[int, tuple[int, int]] = field(default_factory=dict)


def totals(payload: Mapping[str, Any], model: str, version: str | None = None) -> Totals:
    """Sum one model's counters over its versions."""
    out = Totals(stages={s: (0, 0) for s in STAGES})
    for entry in model_entries(payload, model, version):
        out.inferences += _int(entry.get("inference_count"))
        out.executions += _int(entry.get("execution_count"))
        stats = entry.get("inference_stats", {})
        out.success = _add(out.success, _pair(stats.get("success")))
        out.fail = _add(out.fail, _pair(stats.get("fail")))
        for stage in STAGES:
            out.stages[stage] = _add(out.stages[stage], _pair(stats.get(stage)))
        for batch in entry.get("batch_stats", []) or []:
            size = _int(batch.get("batch_size"))
            out.batches[size] = _add(out.batches.get(size, (0, 0)), _pair(batch.get("compute_infer")))
    return out


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] + b[0], a[1] + b[1]


def _sub(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] - b[0], a[1] - b[1]


def _avg_ms(pair: tuple[int, int]) -> float:
    count, ns = pair
    return ns / count / 1e6 if count > 0 else float("nan")


@dataclass
class ServerWindow:
    """What the server saw between two snapshots.

    Stage times are averages *per request*. Triton charges every request in a batch the batch's
    compute time, so ``compute_infer_ms`` is the time a request spent inside an execution, not the
    execution's share per request; ``batch_infer_ms`` gives the time per execution by batch size.
    """

    requests: int
    failures: int
    inferences: int
    executions: int
    avg_batch: float
    server_ms: float
    queue_ms: float
    compute_input_ms: float
    compute_infer_ms: float
    compute_output_ms: float
    #: batch size -> executions at that size in the window (sizes with none are left out).
    batch_hist: dict[int, int]
    #: batch size -> average compute_infer time of one execution at that size.
    batch_infer_ms: dict[int, float]

    def as_row(self, prefix: str = "server_") -> dict[str, Any]:
        """Flat columns for a tidy DataFrame row (the histogram stays a dict in one cell)."""
        row = {f"{prefix}{k}": v for k, v in asdict(self).items() if k not in ("batch_hist", "batch_infer_ms")}
        row["avg_batch"] = self.avg_batch
        row["batch_hist"] = dict(self.batch_hist)
        return row


def window(before: Mapping[str, Any], after: Mapping[str, Any], model: str, version: str | None = None) -> ServerWindow:
    """The delta of two statistics payloads of the same model (``after`` taken later).

    Raises :class:`StatisticsError` if a counter went backwards: the model was reloaded between the
    snapshots (a reload resets its statistics), so the window means nothing.
    """
    a, b = totals(before, model, version), totals(after, model, version)
    success = _sub(b.success, a.success)
    fail = _sub(b.fail, a.fail)
    executions = b.executions - a.executions
    inferences = b.inferences - a.inferences
    if min(success[0], fail[0], executions, inferences) < 0:
        raise StatisticsError(
            f"statistics of '{model}' went backwards between the snapshots: the model was reloaded in "
            "between. Take both snapshots while the same model load is serving."
        )
    stages = {s: _sub(b.stages[s], a.stages[s]) for s in STAGES}
    hist: dict[int, int] = {}
    per_exec: dict[int, float] = {}
    for size in sorted(set(a.batches) | set(b.batches)):
        count, ns = _sub(b.batches.get(size, (0, 0)), a.batches.get(size, (0, 0)))
        if count > 0:
            hist[size] = count
            per_exec[size] = ns / count / 1e6
    return ServerWindow(
        requests=success[0],
        failures=fail[0],
        inferences=inferences,
        executions=executions,
        avg_batch=inferences / executions if executions > 0 else float("nan"),
        server_ms=_avg_ms(success),
        queue_ms=_avg_ms(stages["queue"]),
        compute_input_ms=_avg_ms(stages["compute_input"]),
        compute_infer_ms=_avg_ms(stages["compute_infer"]),
        compute_output_ms=_avg_ms(stages["compute_output"]),
        batch_hist=hist,
        batch_infer_ms=per_exec,
    )


def inference_count(server: RunningServer, model: str) -> int:
    """Rows the server has computed for ``model`` so far (``inference_count``, all versions)."""
    return sum(_int(s.get("inference_count", 0)) for s in fetch_statistics(server, model).get("model_stats", []))


def rows_since(server: RunningServer, model: str, before: int, expected: int, wait_s: float = 3.0) -> int:
    """Rows computed for ``model`` since a count of ``before``, waiting up to ``wait_s`` for ``expected``.

    Triton counts a request when it releases it, a moment after the client has its response, so a
    count read right after the last answer can miss the last batch (seen in CI: 128 of 150 rows).
    Returns early once ``expected`` is reached; a smaller number after ``wait_s`` is the real count.
    """
    return poll(lambda: inference_count(server, model) - before, lambda rows: rows >= expected, wait_s, 0.02)


def batch_rows(entry: dict) -> int:
    """The rows every batch record of a statistics ``entry`` holds: ``batch_stats``' size x executions.

    A backend reports a batch after it has answered its requests (python_backend's PbMetricReporter, the
    C backends' report()), so waiting for these rows is waiting for the batch records themselves.
    """
    return sum(int(b["batch_size"]) * int(b["compute_infer"]["count"]) for b in entry.get("batch_stats", []))


def entry_when(server: RunningServer, model: str, done: Callable[[dict], bool], wait_s: float = 5.0) -> dict:
    """``model``'s statistics entry once ``done(entry)`` holds; the last one read after ``wait_s``.

    For a test or a lesson that knows what the counts must reach: Triton counts a request when it
    releases it, a moment after the client has its answer, so one early read can miss the last
    ones. The caller then asserts the exact numbers on the entry returned.
    """
    return poll(lambda: model_entries(fetch_statistics(server, model), model)[0], done, wait_s, 0.02)


def settled_statistics(server: RunningServer, model: str, attempts: int = 400) -> dict:
    """A statistics snapshot once the counters stop moving.

    Triton updates a request's statistics when it releases the request, which can be a moment
    *after* the client has its response; a snapshot taken right away would push the last warm-up
    request into the measured window. Nothing is in flight here, so counters that stay the same for
    :data:`~lab_backends.waiting.QUIET_S` have settled.
    """
    def key(payload: dict) -> tuple[int, ...]:
        t = totals(payload, model)
        return t.success[0], t.fail[0], t.executions, t.inferences

    return settled(lambda: fetch_statistics(server, model), key, attempts=attempts)


__all__ = ["STAGES", "Metrics", "ServerWindow", "Totals", "entry_when", "fetch_statistics", "inference_count",
           "metrics_delta", "metrics_timeline", "model_entries", "parse_metrics", "rows_since", "scrape_metrics",
           "settled_statistics", "totals", "window"]
