"""The pods behind a shared, multi-replica Triton: who they are and where their traces are.

A class's shared Triton (deploy/triton) runs several pods behind one load-balanced Service.
Inference may go through the Service, but statistics, traces and gRPC connections are *per pod*:
a lesson that reads counts must ask every pod and add them up, and the trace of a request is in
the trace folder of the pod that served it. This module finds the pods:

* ``TRITON_URL`` may be a comma-separated list (``http://triton-0...:8000,http://triton-1...:8000``):
  each is a pod, the first one is the one inference uses;
* ``TRITON_PODS`` may name a headless Service (``triton-pods.lab-class.svc.cluster.local``): DNS
  answers one address per ready pod, looked up when the pods are asked for, so a scale-up is seen;
* ``TRITON_TRACE_FILE`` may hold ``{pod}`` (``/traces/{pod}/trace.json``): where each pod's trace
  file is as the lab sees it (deploy/ mounts ``/traces/<pod name>/`` from a shared volume).

It also says which lessons a shared server cannot serve (:func:`fallback_target`).
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from lab_backends import rest
from lab_backends.errors import RemoteServerError, StatisticsError

POD_PLACEHOLDER = "{pod}"
_SCHEME = re.compile(r"^\w+://")


@dataclass(frozen=True)
class Endpoint:
    """One pod: its HTTP ``host:port`` and its name (pod name, or the address when DNS gives none)."""

    http_url: str
    pod: str
    #: This pod's Prometheus page (full URL); ``None``: its host with the metrics port of TRITON_METRICS_URL.
    metrics_url: str | None = None


def split_urls(value: str | None) -> list[str]:
    """``"http://a:8000, http://b:8000"`` -> ``["a:8000", "b:8000"]`` (scheme and slash dropped)."""
    return [_SCHEME.sub("", part.strip()).rstrip("/") for part in (value or "").split(",") if part.strip()]


def primary_url(value: str | None) -> str | None:
    """The URL inference uses: the first of a list, or the value unchanged when it is one URL."""
    urls = (value or "").split(",")
    return urls[0].strip() if value and len(urls) > 1 else value


def _pod_name(host: str) -> str:
    """``triton-0.triton-pods.ns.svc.cluster.local`` -> ``triton-0``; an address stays an address."""
    return host if re.fullmatch(r"[\d.]+|[0-9a-fA-F:]+", host) else host.split(".")[0]


def resolve_headless(name: str, port: int) -> list[Endpoint]:
    """One endpoint per address DNS gives for a headless Service, named by reverse DNS when it can be."""
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise RemoteServerError(
            f"TRITON_PODS={name!r} does not resolve ({exc}); it should name the headless Service of the "
            "Triton pods (deploy/triton/service-pods.yaml), or unset it to use TRITON_URL alone"
        ) from exc
    found: dict[str, Endpoint] = {}
    for *_, sockaddr in infos:
        address = sockaddr[0]
        try:
            pod = _pod_name(socket.gethostbyaddr(address)[0])
        except OSError:
            pod = address
        host = f"[{address}]" if ":" in address else address
        found[address] = Endpoint(f"{host}:{port}", pod)
    return sorted(found.values(), key=lambda e: e.pod)


def pod_endpoints(url: str | None, env: Mapping[str, str] | None = None) -> list[Endpoint]:
    """Every pod of the server at ``url`` (a list, or ``TRITON_PODS``); empty for a single server."""
    env = os.environ if env is None else env
    urls = split_urls(url)
    headless = env.get("TRITON_PODS")
    if headless:
        port = int(urls[0].rpartition(":")[2]) if urls else 8000
        return resolve_headless(headless.strip(), port)
    if len(urls) > 1:
        metrics = [m.strip() for m in env.get("TRITON_METRICS_URL", "").split(",") if m.strip()]
        if len(metrics) != len(urls):
            metrics = [None] * len(urls)  # type: ignore[list-item]
        return [Endpoint(u, _pod_name(u.rpartition(":")[0]), m) for u, m in zip(urls, metrics)]
    return []


def pod_metrics_url(pod: Endpoint, metrics_url: str) -> str:
    """Where ``pod`` serves ``/metrics``: its own URL, or its host with the port of ``metrics_url``."""
    if pod.metrics_url:
        return pod.metrics_url
    port = re.search(r":(\d+)(/|$)", _SCHEME.sub("", metrics_url))
    host = pod.http_url.rpartition(":")[0]
    return f"http://{host}:{port.group(1) if port else 8002}/metrics"


def trace_files(template: str | Path) -> dict[str, Path]:
    """Pod name -> trace file, for a ``TRITON_TRACE_FILE`` with ``{pod}`` (folders that exist now)."""
    template = str(template)
    if POD_PLACEHOLDER not in template:
        return {}
    head, _, tail = template.partition(POD_PLACEHOLDER)
    base = Path(head)
    if not base.is_dir():
        raise RemoteServerError(
            f"TRITON_TRACE_FILE={template!r}: {base} is not a folder here; mount the Triton pods' trace "
            "volume there (deploy/jupyterhub/values.yaml mounts it at /traces)"
        )
    return {d.name: Path(head + d.name + tail) for d in sorted(base.iterdir()) if d.is_dir()}


# ------------------------------------------------------------------------------ statistics, summed
# Each pod counts only what it served: a lesson reading ``inference_count`` through the
# load-balanced Service would see one pod's share, a different one at each call. Where a lesson
# reads counts, every pod is asked and the payloads are added up into one payload of the same shape.
_PAIRS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


def statistics_payload(http_url: str, model: str, headers: Mapping[str, str], timeout_s: float = 10.0,
                       who: str = "the server") -> dict:
    """``GET /v2/models/<model>/stats`` at ``http_url``: the one way this package reads the statistics API.

    Through :func:`lab_backends.rest.request` rather than ``tritonclient.http``, so it may run from
    any thread (the latter is gevent-based and must stay on one thread), e.g. during a load.
    """
    path = f"/v2/models/{model}/stats" if model else "/v2/models/stats"
    try:
        status, body = rest.request(f"http://{http_url}{path}", headers=dict(headers), timeout=timeout_s)
    except OSError as exc:
        raise StatisticsError(f"{who} did not answer the statistics API: {exc}") from exc
    if status != 200:
        raise StatisticsError(
            f"{who} answered HTTP {status} for the statistics of '{model}': {body.decode(errors='replace')[:300]}. "
            "Is the model loaded, and does the server object carry the admin key?"
        )
    return json.loads(body)


def pod_statistics(pod: Endpoint, model: str, headers: Mapping[str, str], timeout_s: float = 10.0) -> dict:
    """One pod's statistics payload (the API may be open on a shared server: headers may be empty)."""
    return statistics_payload(pod.http_url, model, headers, timeout_s, who=f"pod {pod.pod} ({pod.http_url})")


def _add_pair(into: dict, entry: Mapping[str, Any] | None) -> None:
    entry = entry or {}
    into["count"] = int(into.get("count", 0)) + int(entry.get("count", 0) or 0)
    into["ns"] = int(into.get("ns", 0)) + int(entry.get("ns", 0) or 0)


def sum_payloads(payloads: Iterable[Mapping[str, Any]]) -> dict:
    """Several pods' ``model_stats`` payloads added up per (model, version), counters and batch stats."""
    merged: dict[tuple[str, str], dict] = {}
    for payload in payloads:
        for entry in payload.get("model_stats", []):
            key = (entry.get("name", ""), str(entry.get("version", "")))
            out = merged.setdefault(key, {"name": key[0], "version": key[1], "last_inference": 0,
                                          "inference_count": 0, "execution_count": 0,
                                          "inference_stats": {}, "batch_stats": []})
            out["last_inference"] = max(int(out["last_inference"]), int(entry.get("last_inference", 0) or 0))
            out["inference_count"] += int(entry.get("inference_count", 0) or 0)
            out["execution_count"] += int(entry.get("execution_count", 0) or 0)
            for name in _PAIRS:
                _add_pair(out["inference_stats"].setdefault(name, {}), entry.get("inference_stats", {}).get(name))
            sizes = {int(b["batch_size"]): b for b in out["batch_stats"]}
            for batch in entry.get("batch_stats", []) or []:
                size = int(batch.get("batch_size", 0))
                into = sizes.setdefault(size, {"batch_size": size})
                for stage in ("compute_input", "compute_infer", "compute_output"):
                    _add_pair(into.setdefault(stage, {}), batch.get(stage))
            out["batch_stats"] = [sizes[s] for s in sorted(sizes)]
    return {"model_stats": list(merged.values())}


def summed_statistics(server: Any, model: str = "", timeout_s: float = 10.0) -> dict:
    """The statistics of ``model`` over every pod of ``server.endpoints``, as one payload."""
    pods = server.endpoints
    return sum_payloads(pod_statistics(p, model, server.admin_headers, timeout_s) for p in pods)



#: Lessons a shared server cannot serve to one learner, and why.
SHARED_LIMITS = {
    "model-control": "loading and unloading models changes the server for the whole class",
    "config-override": "a config override reloads the model for the whole class",
    "c-backend": "a C backend built in your pod cannot be loaded into the shared server",
    "repository": "the repository index is a restricted API, and the shared server keeps its admin key from learners",
}


def fallback_target(need: str, env: Mapping[str, str] | None = None, say=print) -> str | None:
    """``"local"`` when ``TRITON_URL`` is a shared server this lesson cannot use, else ``None``.

    Shared means: a remote server and no ``TRITON_ADMIN_KEY`` (learners of a class never get it).
    The learner's embedded CPU Triton then serves the lesson, and ``say`` explains why.
    """
    env = os.environ if env is None else env
    if need not in SHARED_LIMITS:
        raise RemoteServerError(f"unknown need {need!r}; choose one of {', '.join(SHARED_LIMITS)}")
    if not env.get("TRITON_URL") or env.get("TRITON_ADMIN_KEY"):
        return None
    say(f"This lesson uses your own embedded Triton, not the shared one at TRITON_URL: {SHARED_LIMITS[need]}.")
    return "local"
