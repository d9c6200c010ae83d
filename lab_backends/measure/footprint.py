"""A learner's footprint: what one notebook, run top to bottom, costs the machine and the server.

Why sample from outside: a notebook starts its own embedded Triton inside its kernel; nothing in
the notebook should change to be measured. A sampler that walks the process tree of the runner
(pytest/nbval -> kernel -> tritonserver -> Python stubs) sees every server a notebook starts, reads
its memory and CPU time with psutil, and reads its statistics API with the admin key found on the
server's own command line (readable here: same user). From consecutive statistics snapshots it
records the *request stream* (requests and server time per model per interval), which
:mod:`lab_backends.measure.class_plan` replays to plan a class.

Peak concurrency is the largest mean number of requests inside the server over one sampling
interval (Little's law: server time accumulated in the interval / its length), per model.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from lab_backends import rest

_SERVER = "tritonserver"
_STUB = "triton_python_backend_stub"


@dataclass
class ServerSeen:
    """One tritonserver seen during a run: where it listens and its admin key (from its argv)."""

    pid: int
    http_port: int
    admin_key: str
    #: model -> (requests, server ns, compute ns, executions) at the last snapshot, cumulative.
    last: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: model -> batch size -> [executions, compute ns], cumulative, at the last snapshot.
    batches: dict[str, dict[int, list[int]]] = field(default_factory=dict)


@dataclass
class Footprint:
    """What a run cost: memory, CPU and the requests the servers received."""

    wall_s: float = 0.0
    peak_server_rss_mb: float = 0.0
    peak_kernel_rss_mb: float = 0.0
    server_cpu_s: float = 0.0
    kernel_cpu_s: float = 0.0
    servers: int = 0
    #: model -> requests received.
    requests: dict[str, int] = field(default_factory=dict)
    #: model -> peak mean requests in the server over one interval.
    peak_concurrency: dict[str, float] = field(default_factory=dict)
    #: model -> batch size -> [executions, compute ns of those executions] (all servers of the run).
    batches: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    #: [t_s, model, requests, server_ns, busy_ns] per interval with traffic: the stream to replay.
    #: ``busy_ns``: time the model's instance was busy for them (compute, shared by a batch).
    stream: list[list[Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _server_of(proc: psutil.Process) -> ServerSeen | None:
    try:
        args = proc.cmdline()
    except psutil.Error:
        return None
    flags = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
    if "--http-port" not in flags:
        return None
    key = re.search(r":admin-key=(.+)$", flags.get("--http-restricted-api", ""))
    return ServerSeen(proc.pid, int(flags["--http-port"]), key.group(1) if key else "")


def _model_totals(server: ServerSeen) -> dict[str, tuple[int, ...]]:
    """Per model: (requests, server ns, compute ns, executions); batch stats go to ``server.batches``."""
    headers = {"admin-key": server.admin_key} if server.admin_key else {}
    try:
        status, body = rest.request(f"http://127.0.0.1:{server.http_port}/v2/models/stats", headers=headers,
                                    timeout=2.0)
    except OSError:
        return {}
    if status != 200:
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for entry in json.loads(body).get("model_stats", []):
        stats = entry.get("inference_stats", {})
        compute = sum(int(stats.get(k, {}).get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output"))
        now = (int(stats.get("success", {}).get("count", 0)), int(stats.get("success", {}).get("ns", 0)), compute,
               int(entry.get("execution_count", 0)))
        sizes = server.batches.setdefault(entry["name"], {})
        for batch in entry.get("batch_stats", []) or []:
            ns = sum(int(batch.get(k, {}).get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output"))
            sizes[int(batch["batch_size"])] = [int(batch.get("compute_infer", {}).get("count", 0)), ns]
        before = out.get(entry["name"], (0, 0, 0, 0))
        out[entry["name"]] = tuple(a + b for a, b in zip(before, now))
    return out


def interval_counts(before: tuple[int, ...], now: tuple[int, ...]) -> tuple[int, ...]:
    """What one model's cumulative counters gained between two snapshots, field by field.

    Why not a plain difference: a config change reloads the model and Triton restarts its
    statistics at zero, so a count that went down means "reloaded since": everything counted now
    is new (requests served between the last snapshot and the reload are the only ones missed).
    """
    if now and before and now[0] < before[0]:
        before = (0,) * len(now)
    return tuple(a - b for a, b in zip(now, before))


class Sampler:
    """Call :meth:`sample` every ``interval_s`` while the run lasts, then :meth:`result`."""

    def __init__(self, root_pid: int, interval_s: float = 0.5) -> None:
        self.root = psutil.Process(root_pid)
        self.interval_s = interval_s
        self.t0 = time.monotonic()
        self.fp = Footprint()
        self._cpu: dict[int, tuple[str, float]] = {}
        self._servers: dict[int, ServerSeen] = {}
        self._t_last = 0.0

    def sample(self) -> None:
        now = time.monotonic() - self.t0
        try:
            tree = self.root.children(recursive=True)
        except psutil.Error:
            return
        server_rss = kernel_rss = 0
        for proc in tree:
            try:
                name = proc.name()
                mem = proc.memory_info().rss
                cpu = proc.cpu_times()
                parent_names = {p.name() for p in proc.parents()}
            except psutil.Error:
                continue
            in_server = name in (_SERVER, _STUB) or _SERVER in parent_names
            if in_server:
                server_rss += mem
            elif "ipykernel" in " ".join(_safe_cmdline(proc)):
                kernel_rss += mem
            else:
                continue
            self._cpu[proc.pid] = ("server" if in_server else "kernel", cpu.user + cpu.system)
            if name == _SERVER and proc.pid not in self._servers:
                seen = _server_of(proc)
                if seen:
                    self._servers[proc.pid] = seen
        self.fp.peak_server_rss_mb = max(self.fp.peak_server_rss_mb, server_rss / 2**20)
        self.fp.peak_kernel_rss_mb = max(self.fp.peak_kernel_rss_mb, kernel_rss / 2**20)
        dt = max(now - self._t_last, 1e-3)
        for server in self._servers.values():
            for model, totals in _model_totals(server).items():
                requests, ns, compute, execs = interval_counts(server.last.get(model, (0, 0, 0, 0)), totals)
                if requests > 0:
                    # Every request of a batch is charged the batch's compute time: the instance was
                    # busy for compute / (requests per execution).
                    busy = compute * max(execs, 1) // requests
                    self.fp.stream.append([round(now, 2), model, requests, ns, busy])
                    self.fp.requests[model] = self.fp.requests.get(model, 0) + requests
                    conc = ns / 1e9 / dt
                    self.fp.peak_concurrency[model] = round(max(self.fp.peak_concurrency.get(model, 0.0), conc), 2)
                server.last[model] = totals
        self._t_last = now

    def result(self) -> Footprint:
        self.fp.wall_s = round(time.monotonic() - self.t0, 1)
        self.fp.server_cpu_s = round(sum(c for kind, c in self._cpu.values() if kind == "server"), 1)
        self.fp.kernel_cpu_s = round(sum(c for kind, c in self._cpu.values() if kind == "kernel"), 1)
        self.fp.peak_server_rss_mb = round(self.fp.peak_server_rss_mb, 1)
        self.fp.peak_kernel_rss_mb = round(self.fp.peak_kernel_rss_mb, 1)
        self.fp.servers = len(self._servers)
        for server in self._servers.values():
            for model, sizes in server.batches.items():
                into = self.fp.batches.setdefault(model, {})
                for size, (count, ns) in sizes.items():
                    old = into.get(size, [0, 0])
                    into[size] = [old[0] + count, old[1] + ns]
        return self.fp


def _safe_cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []
