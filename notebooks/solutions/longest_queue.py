"""Solution: which request waited longest in the scheduler queue? (notebook 02)"""


def answer(log) -> str:
    top = log.requests[log.requests["depth"] == 0]  # children of ensembles/BLS have their own queue
    return top.loc[top["queue_ms"].idxmax(), "request_id"]
