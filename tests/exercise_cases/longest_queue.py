"""Audit cases of ``longest_queue`` (notebook 02): which request of a burst queued longest, from the trace."""

from lab_backends.lessons.exercises.audit import Wrong


def _top(log):
    return log.requests[log.requests["depth"] == 0]


def _from_stamps(log):
    """From the raw stamps: COMPUTE_START - QUEUE_START per trace, the largest one's request id."""
    stamps = log.stamps.pivot_table(index="trace_id", columns="name", values="ns", aggfunc="min")
    waits = (stamps["COMPUTE_START"] - stamps["QUEUE_START"]).dropna()
    top = _top(log).set_index("trace_id")
    return top.loc[waits[waits.index.isin(top.index)].idxmax(), "request_id"]


WRONG = [
    Wrong("takes the shortest wait", lambda log: _top(log).loc[_top(log)["queue_ms"].idxmin(), "request_id"],
          r"queued longest"),
    Wrong("returns the trace id instead of the request id",
          lambda log: _top(log).loc[_top(log)["queue_ms"].idxmax(), "trace_id"], r"not one of the burst's request ids"),
    Wrong("returns the longest wait itself, a number", lambda log: _top(log)["queue_ms"].max(),
          r"not one of the burst's request ids"),
]

ALTERNATIVES = [
    lambda log: _top(log).sort_values("queue_ms").iloc[-1]["request_id"],
    _from_stamps,
]
