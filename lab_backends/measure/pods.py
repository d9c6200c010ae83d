"""Traces of a Triton that runs as several pods (see lab_backends.server.endpoints).

Statistics are summed over the pods in the server layer (:func:`lab_backends.server.endpoints.summed_statistics`,
so ``TritonServer.statistics`` can use it too); this module re-exports it for the measure layer.

A trace lives in the trace file of the pod that served the request, and trace ids restart at 1
on every pod, so records of several pods must never be mixed: :func:`pod_trace_file` finds the
one pod whose file holds the requests asked for.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

from lab_backends import rest
from lab_backends.errors import StatisticsError, TraceError
from lab_backends.measure.prometheus import Metrics, parse_metrics, render_metrics
from lab_backends.measure.trace_records import read_records
from lab_backends.server import endpoints
from lab_backends.server.endpoints import sum_payloads, summed_statistics  # noqa: F401 - re-exported


def summed_metrics(server: Any, timeout_s: float = 10.0) -> str:
    """Every pod's Prometheus page, samples with equal name and labels added up, as one page.

    Counters and gauges both add up across pods (requests, queued requests, memory), and so do a
    histogram's buckets and a summary's ``_sum`` and ``_count``; quantiles of summaries do not, and
    are left out rather than made up.
    """
    total = Metrics({}, {}, {})
    for pod in server.endpoints:
        url = endpoints.pod_metrics_url(pod, server.metrics_url)
        try:
            status, body = rest.request(url, timeout=timeout_s)
        except OSError as exc:
            raise StatisticsError(f"pod {pod.pod} did not serve its metrics at {url}: {exc}") from exc
        if status != 200:
            raise StatisticsError(f"pod {pod.pod}: the metrics page {url} answered HTTP {status}")
        page = parse_metrics(body.decode())
        total.types.update(page.types)
        total.family_of.update(page.family_of)
        for key, value in page.samples.items():
            if any(label == "quantile" for label, _ in key[1]):
                continue
            total.samples[key] = total.samples.get(key, 0.0) + value
    return render_metrics(total)


def _served(path: Path, request_ids: set[str]) -> bool:
    try:
        records = read_records(path)
    except TraceError:
        return False
    found = {r.get("request_id") for r in records if r.get("request_id")}
    return request_ids <= found


def pod_trace_file(path: str | Path, request_ids: Iterable[str] = (), timeout_s: float = 10.0) -> Path:
    """The trace file of the pod that served ``request_ids``; ``path`` unchanged if it has no ``{pod}``.

    Waits up to ``timeout_s``: a pod writes a request's trace a moment after the response.
    """
    if endpoints.POD_PLACEHOLDER not in str(path):
        return Path(path)
    wanted = set(request_ids)
    if not wanted:
        raise TraceError(
            f"{path} has one trace file per pod: name the request (request_ids=[...]) so that the pod that "
            "served it can be found; trace ids restart on every pod, so their files cannot be merged"
        )
    deadline = time.monotonic() + timeout_s
    while True:
        files = endpoints.trace_files(path)
        hits = [(pod, f) for pod, f in files.items() if _served(f, wanted)]
        if len(hits) == 1:
            return hits[0][1]
        if len(hits) > 1:
            raise TraceError(f"requests {sorted(wanted)} appear in the traces of several pods "
                             f"({', '.join(p for p, _ in hits)}): use request ids unique to this run")
        if time.monotonic() > deadline:
            raise TraceError(f"no single pod's trace ({', '.join(files) or 'no pod folders'}) holds all of "
                             f"{sorted(wanted)[:5]} after {timeout_s:.0f} s; were they sent with those ids, "
                             "and is tracing on (rate 1)?")
        time.sleep(0.1)


def which_pod(path: str | Path, request_id: str, timeout_s: float = 10.0) -> str:
    """The name of the pod that served ``request_id`` (its trace folder's name)."""
    return pod_trace_file(path, [request_id], timeout_s).parent.name
