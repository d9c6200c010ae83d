"""System shared memory (notebook 01): the tensor stays in a region both processes map; only its name travels.

With Triton's shared-memory extension the client writes a tensor into a POSIX shared-memory
object (``/dev/shm/<key>``), *registers* it with the server under a name (a restricted API here:
the admin key), and an ``infer`` request then names the region, an offset and a byte size instead of
carrying the bytes. The server maps the region once, at registration
(server ``src/shared_memory_manager.cc`` at r24.10), and reads inputs from / writes outputs into it.

What can go wrong is answered by Triton itself, and :func:`failure_modes` shows each answer:

* a region that was never registered: ``Unable to find shared memory region`` (``GetMemoryInfo``,
  ``shared_memory_manager.cc`` 466-472);
* an offset + byte size past the region's end: ``Invalid offset + byte size for shared memory
  region`` (the same function, 488-497), for an input and for an output alike (the HTTP front end
  checks an output's stated region, offset and size there too, ``http_server.cc`` 2798-2811);
* an output whose *stated* byte size is smaller than the output: ``should be at least N bytes to
  hold the results`` (the HTTP front end's output allocator, server ``src/http_server.cc``
  1229-1243). What it compares is the ``shared_memory_byte_size`` the request states
  (parsed at 918-924, kept as the output's ``byte_size_`` at 2825-2829), not the region's size:
  a region big enough does not help a request that states too small a size.

:func:`regions` creates and registers regions and, whatever happens inside it, unregisters them
(first: the server keeps its mapping until then) and destroys them (unlinks ``/dev/shm``).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import statistics
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pandas as pd
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from tritonclient.utils import shared_memory as shm

from lab_backends.client.latency import compare_latency
from lab_backends.client.protocol import grpc_exchange, http_exchange, timed_post
from lab_backends.client.wire import triton_dtype
from lab_backends.errors import ProtocolError
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll

#: Every region this lesson makes is named ``lab_shm_<token>_<role>`` (the token starts with the PID):
#: easy to find in ``/dev/shm``, and never another process's.
PREFIX = "lab_shm"
DEV_SHM = Path("/dev/shm")
SHM_WAY = "REST, system shared memory"


@dataclass(frozen=True)
class Region:
    """One system shared-memory region: created here, registered with the server under ``name``."""

    name: str  #: the name Triton knows it by (register, infer, unregister)
    key: str  #: the POSIX key, ``/<name>``: the file ``/dev/shm/<name>``
    byte_size: int
    handle: Any = field(repr=False, compare=False)  #: tritonclient's handle

    @property
    def path(self) -> Path:
        return DEV_SHM / self.key.lstrip("/")

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handle, [np.ascontiguousarray(array)], offset)

    def read(self, dtype: Any, shape: list[int], offset: int = 0) -> np.ndarray:
        """A *copy* of the contents: a view left alive would keep the region from being closed."""
        return np.array(shm.get_contents_as_numpy(self.handle, np.dtype(dtype), shape, offset), copy=True)


def own_prefix() -> str:
    """The start of every region name this process makes by default: ``lab_shm_<pid>x``."""
    return f"{PREFIX}_{os.getpid()}x"


def leftovers(prefix: str = PREFIX) -> list[str]:
    """The files in ``/dev/shm`` whose names start with ``prefix``: what a lesson could leave behind."""
    return sorted(p.name for p in DEV_SHM.glob(f"{prefix}*"))


def registered(server: RunningServer) -> list[str]:
    """The names of the system shared-memory regions the server has registered (a restricted API)."""
    status = server.http_client.get_system_shared_memory_status(headers=server.admin_headers)
    return sorted(entry["name"] for entry in status)


@contextlib.contextmanager
def regions(server: RunningServer, sizes: Mapping[str, int], token: str | None = None) -> Iterator[dict[str, Region]]:
    """One region per ``role: byte_size``, created and registered; always unregistered, then destroyed.

    Each step's undo is pushed as soon as the step succeeds, so an error anywhere (in a create, a
    register, or the body of the ``with``) undoes exactly what was done, in reverse order; one
    failing undo does not stop the others (:class:`contextlib.ExitStack`).
    """
    token = token or own_prefix()[len(PREFIX) + 1:] + uuid.uuid4().hex[:6]
    client = server.http_client
    with contextlib.ExitStack() as undo:
        made: dict[str, Region] = {}
        for role, size in sizes.items():
            name = f"{PREFIX}_{token}_{role}"
            handle = shm.create_shared_memory_region(name, "/" + name, size, create_only=True)
            undo.callback(shm.destroy_shared_memory_region, handle)
            client.register_system_shared_memory(name, "/" + name, size, headers=server.admin_headers)
            undo.callback(unregister, client, name, server.admin_headers)
            made[role] = Region(name, "/" + name, size, handle)
        yield made


#: How long :func:`unregister` waits for Triton to let go of a region.
RELEASE_WAIT_S = 5.0


def unregister(client: Any, name: str, headers: Mapping[str, str] | None = None) -> None:
    """Unregister ``name``, retrying while Triton still holds it for a request (bounded).

    Triton releases a request a moment *after* its response reaches the client, and refuses to
    unregister a region while a request still holds it: ``use_count() > 1`` answers "it is
    currently in use" (server ``src/shared_memory_manager.cc`` 686-695 at r24.10). Unregistering
    right after an answer races that release on a busy machine (a flake hunt saw it), so that one
    refusal is retried for up to :data:`RELEASE_WAIT_S`; any other error, or the same one after the
    wait, is raised.
    """
    def attempt() -> InferenceServerException | None:
        try:
            client.unregister_system_shared_memory(name, headers=headers)
            return None
        except InferenceServerException as exc:
            return exc

    error = poll(attempt, lambda e: e is None or "currently in use" not in str(e), RELEASE_WAIT_S, 0.02)
    if error is not None:
        raise error


def same_machine(server: RunningServer) -> RunningServer:
    """``server`` when it runs here (its ``/dev/shm`` is ours), else a new embedded one serving ``echo``.

    A server at ``TRITON_URL`` (another container or host) cannot map this machine's regions, and a
    shared class server keeps its admin key (the shared-memory API is restricted). Stop the one
    returned when it is not ``server``.
    """
    if getattr(server, "target", None) == "local":
        return server

    print("System shared memory needs the server on this machine: starting an embedded one for this section.")
    return TritonServer(models=["echo"], target="local").start()


def _shm_tensors(tensor: np.ndarray, input_region: str, output_region: str, output_bytes: int,
                 input_offset: int = 0) -> tuple[list, list]:
    """tritonclient's ``INPUT0`` and ``OUTPUT0`` (an ``echo``-like model), both pointing at regions by name."""
    infer_input = httpclient.InferInput("INPUT0", list(tensor.shape), triton_dtype(tensor))
    infer_input.set_shared_memory(input_region, tensor.nbytes, offset=input_offset)
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(output_region, output_bytes)
    return [infer_input], [output]


@dataclass(frozen=True)
class Comparison:
    """The same tensor four ways: one row per way (bytes, latency) and what each way returned."""

    table: pd.DataFrame
    outputs: dict[str, np.ndarray]
    shm_request: str  #: the whole body of the shared-memory request: JSON that names regions
    tensor_bytes: int
    region_names: tuple[str, ...]  #: the regions it used (all gone once it returns)


def compare_ways(server: RunningServer, tensor: np.ndarray, repeats: int = 10, model: str = "echo",
                 warmup: int = 2, token: str | None = None) -> Comparison:
    """REST JSON, REST binary, gRPC and system shared memory, side by side (sequential, bounded).

    The first three rows are :func:`~lab_backends.client.latency.compare_latency`'s; the shared
    memory row is timed the same way (body encoded once, one connection, clock from sending to
    the last byte read): the input is written into its region once, the output read back once.
    """
    if not 1 <= repeats <= 1000:
        raise ValueError(f"repeats must be between 1 and 1000, not {repeats}")
    tensor = np.ascontiguousarray(tensor, dtype=np.float32)
    table = compare_latency(server, model, {"INPUT0": tensor}, repeats=repeats, warmup=warmup)
    outputs = {
        "REST, JSON tensors": http_exchange(server, model, {"INPUT0": tensor}).outputs["OUTPUT0"],
        "REST, binary tensors": http_exchange(server, model, {"INPUT0": tensor}, binary=True).outputs["OUTPUT0"],
        "gRPC (protobuf, raw bytes)": grpc_exchange(server, model, {"INPUT0": tensor}).outputs["OUTPUT0"],
    }
    host, _, port = server.http_url.rpartition(":")
    with regions(server, {"input": tensor.nbytes, "output": tensor.nbytes}, token) as r:
        r["input"].write(tensor)
        inputs, requested = _shm_tensors(tensor, r["input"].name, r["output"].name, tensor.nbytes)
        answer = server.http_client.infer(model, inputs, outputs=requested)  # what a client writes
        described = answer.get_output("OUTPUT0") or {}
        if "data" in described or "binary_data_size" in described.get("parameters", {}):
            raise ProtocolError(f"the shared-memory response carried the output's data: {described}")
        outputs[SHM_WAY] = r["output"].read(tensor.dtype, list(tensor.shape))
        body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=requested)
        if json_size is not None:
            raise ProtocolError("the shared-memory request carries binary data: the tensor is in the body")
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        times: list[float] = []
        try:
            for i in range(warmup + repeats):
                _, payload, elapsed = timed_post(conn, f"/v2/models/{model}/infer", body, headers)
                if i >= warmup:
                    times.append(elapsed)
        finally:
            conn.close()
    row = pd.DataFrame([{"variant": SHM_WAY, "request_bytes": len(body), "response_bytes": len(payload),
                         "p50_ms": statistics.median(times), "p90_ms": float(np.percentile(times, 90)),
                         "requests": len(times)}]).set_index("variant")
    return Comparison(pd.concat([table, row]), outputs, body.decode() if isinstance(body, bytes) else body,
                      tensor.nbytes, tuple(region.name for region in r.values()))


#: The failure modes: the case, the phrase Triton's source writes, and where it writes it.
FAILURES = {
    "unregistered region": ("Unable to find shared memory region",
                            "server src/shared_memory_manager.cc 466-472, GetMemoryInfo"),
    "input offset + size past the region": ("Invalid offset + byte size for shared memory region",
                                            "server src/shared_memory_manager.cc 488-497, GetMemoryInfo"),
    "output size past the region": ("Invalid offset + byte size for shared memory region",
                                    "server src/http_server.cc 2798-2811 -> GetMemoryInfo, before the model runs"),
    "output size stated too small": ("bytes to hold the results",
                                     "server src/http_server.cc 1229-1243, the output allocator: the stated size"),
}


def failure_modes(server: RunningServer, n: int = 1024, model: str = "echo", token: str | None = None) -> pd.DataFrame:
    """Requests that shared memory gets wrong, each answered by Triton: one row per :data:`FAILURES` case.

    The two output cases tell apart which size Triton compares: a request that states the output's
    full size for a region half as big is refused before the model runs (the region's bounds); a
    request that states half the size for a region big enough is refused by the output allocator,
    which compares the output with the *stated* size. Columns: ``error`` (Triton's message, as the
    client got it), ``expected`` (the phrase of the source that writes it), ``matches`` and
    ``where``. The regions are always cleaned up.
    """
    tensor = np.arange(n, dtype=np.float32)
    nbytes = tensor.nbytes
    errors: dict[str, str] = {}

    def attempt(case: str, inputs: list, outputs: list) -> None:
        try:
            server.http_client.infer(model, inputs, outputs=outputs)
            errors[case] = "(no error: the request was served)"
        except InferenceServerException as exc:
            errors[case] = exc.message() or str(exc)

    with regions(server, {"input": nbytes, "output": nbytes, "small": nbytes // 2}, token) as r:
        r["input"].write(tensor)
        inp, out, small = r["input"].name, r["output"].name, r["small"].name
        attempt("unregistered region", *_shm_tensors(tensor, f"{PREFIX}_never_registered", out, nbytes))
        attempt("input offset + size past the region", *_shm_tensors(tensor, inp, out, nbytes, input_offset=4))
        attempt("output size past the region", *_shm_tensors(tensor, inp, small, nbytes))
        attempt("output size stated too small", *_shm_tensors(tensor, inp, out, nbytes // 2))
    rows = [{"case": case, "error": errors[case], "expected": phrase, "matches": phrase in errors[case],
             "where": where} for case, (phrase, where) in FAILURES.items()]
    return pd.DataFrame(rows).set_index("case")


def latency_lines(table: pd.DataFrame, tensor_bytes: int, against: str = "REST, binary tensors") -> list[str]:
    """What :func:`compare_ways`' latency columns say about shared memory against ``against``, in words.

    The verdict is read from this run's p50 and p90: *faster* only if shared memory's p90 is under
    the other's p50, *slower* only the other way round, else *no clear difference* (their p50-p90
    ranges overlap). Then the p50 gap, signed: the two requests differ only in where the tensor travels.
    """
    shm_row, other = table.loc[SHM_WAY], table.loc[against]
    ranges = (f"shared memory p50 {shm_row.p50_ms:.2f} ms, p90 {shm_row.p90_ms:.2f} ms; "
              f"{against} p50 {other.p50_ms:.2f} ms, p90 {other.p90_ms:.2f} ms")
    if shm_row.p90_ms < other.p50_ms:
        verdict = f"shared memory was faster than {against} in this run: even its p90 was under the other's p50"
    elif other.p90_ms < shm_row.p50_ms:
        verdict = f"shared memory was slower than {against} in this run: the other's p90 was under its p50"
    else:
        verdict = f"no clear difference between shared memory and {against} in this run: their p50-p90 ranges overlap"
    gap = other.p50_ms - shm_row.p50_ms
    cost = (f"p50 gap: {against} {other.p50_ms:.2f} ms - shared memory {shm_row.p50_ms:.2f} ms = {gap:+.2f} ms "
            f"({gap / other.p50_ms:+.0%} of {against}'s p50); the two requests differ only in where the tensor's "
            f"{tensor_bytes / 2**20:.2f} MiB travel, both ways: through the socket, or through the regions")
    p50 = table["p50_ms"]
    ratios = ", ".join(f"{way} {p50[way] / p50[SHM_WAY]:.1f}x" for way in p50.index if way != SHM_WAY)
    return [ranges, verdict, cost, f"p50 relative to shared memory: {ratios}"]
