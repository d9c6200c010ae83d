"""Triton 2.51 writes into a freed Trace when it releases a trace (upstream defect), and our preload
(``c_backends/preload/free_quarantine.c``) keeps that write inside memory nobody else can have.

``TraceManager::TraceRelease`` (server src/tracer.cc:743-750 at r24.10) frees the Trace whose mutex it
holds, then unlocks that mutex. Stop 43's CI lost a traced server to heap corruption (glibc: "corrupted
size vs. prev_size", in a burst of test_batch_strategy.py); this is the one write after free the check
below finds in a server's process, and only with tracing. Fixed upstream by server 25baa7b (#8144,
v2.57.0). ``lab_backends/server/free_quarantine.py`` says why a preload and how it works.

Deterministic evidence, not a crash: a crash needs another thread to be handed the freed memory within a few
instructions (once in some 60 ``make test`` runs). The preload's check instead compares every freed block,
while it is held, with a copy taken at its free, and logs each write after free with its bytes.

Deterministic order, not a race: the write needs TraceRelease to hold the last reference to the Trace, i.e.
the gRPC front end to have dropped its own first, when it recycles the call's state
(src/grpc/infer_handler.h:1110-1130). With a plain model that is a race (measured: 596 of 720 requests in
bursts to rel_double; stop 50's CI: 0 of 120). ``rel_respond_then_hold`` answers through the response sender
and keeps its requests ``hold_ms`` more, so each request is released (and its trace with it) long after its
answer went out: every traced request writes into its freed Trace, and no untraced one.
``upstream``: the traced case FAILS the day an upgrade unlocks before it frees; then the preload can go.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from lab_backends.errors import BackendBuildError
from lab_backends.measure.trace_control import update_trace_settings
from lab_backends.server import free_quarantine
from lab_backends.server.triton_server import TritonServer
from tests.reliability.conftest import TEST_MODELS

pytestmark = pytest.mark.server
#: Requests in the plain bursts (no write without tracing, whatever the order).
REQUESTS = 120
#: Traced requests that the model keeps after answering: each one writes into its freed Trace.
HELD = 8
#: How long they are kept: the gRPC front end recycles a call's state within milliseconds of its answer.
HOLD_MS = 500
#: What pthread_mutex_unlock writes in the freed Trace: __lock (16-19), __owner (24-27), __nusers (28).
MUTEX_BYTES = (16, 28)
X = np.arange(16, dtype=np.float32).reshape(1, 16)


def _send(server: TritonServer, model: str, count: int, hold_ms: int = 0) -> None:
    """``count`` gRPC requests at once (as batch_strategy.tagged_burst sends its bursts), all answered."""
    tensor = grpcclient.InferInput("INPUT0", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    answers: list = []
    done = threading.Semaphore(0)

    def finish(result, error) -> None:
        answers.append(error if error is not None else result.as_numpy("OUTPUT0"))
        done.release()

    client = grpcclient.InferenceServerClient(server.grpc_url)
    parameters = {"hold_ms": hold_ms} if hold_ms else None
    try:
        for _ in range(count):
            client.async_infer(model, [tensor], finish, parameters=parameters, client_timeout=60)
        assert all(done.acquire(timeout=60) for _ in range(count)), f"{len(answers)} of {count} answered"
    finally:
        client.close()
    assert all(isinstance(a, np.ndarray) and np.array_equal(a, 2 * X) for a in answers), answers[:3]


def _writes(server: TritonServer) -> list[free_quarantine.WriteAfterFree]:
    found = free_quarantine.writes_after_free(Path(server.log_path).read_text(errors="replace"))
    return [w for w in found if w.pid == server.pid]


@pytest.fixture(scope="module")
def checked_server(tmp_path_factory):
    """A server started with the preload's check on and tracing configured, but off (level OFF)."""
    trace = tmp_path_factory.mktemp("trace") / "trace.json"
    with mock.patch.dict(os.environ, {free_quarantine.CHECK_VARIABLE: "1"}):
        server = TritonServer(TEST_MODELS, models=["rel_double", "rel_respond_then_hold"], trace_file=trace,
                              trace_level=("OFF",))
        server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.upstream
def test_releasing_a_trace_writes_into_the_freed_trace_and_only_then(checked_server):
    server = checked_server
    assert "LD_PRELOAD" not in os.environ  # only the server is preloaded, not this test
    with open(f"/proc/{server.pid}/maps") as maps:
        assert str(free_quarantine.LIBRARY) in maps.read(), "the server runs without the preload"

    _send(server, "rel_double", REQUESTS)  # untraced: not one write after free in the server's process
    _send(server, "rel_respond_then_hold", HELD, hold_ms=HOLD_MS)  # nor in the order that writes when traced
    _send(server, "rel_respond_then_hold", 5 * HELD)  # more frees on its thread: held blocks are compared
    assert _writes(server) == [], "writes after free without tracing: they are not the trace release's"

    update_trace_settings(server, trace_level=["TIMESTAMPS"], trace_rate="1")
    _send(server, "rel_respond_then_hold", HELD, hold_ms=HOLD_MS)
    update_trace_settings(server, trace_level=["OFF"])
    _send(server, "rel_respond_then_hold", 5 * HELD)  # untraced: the traced Traces leave the ring, compared
    writes = _writes(server)
    assert writes, (
        f"{HELD} traced requests released after their answers and Triton never wrote into a freed Trace's "
        "mutex: an upgrade fixed TraceRelease (server #8144)? Then drop the preload "
        "(lab_backends/server/free_quarantine.py)"
    )
    # One write per traced request, each at the mutex and nowhere else.
    assert [(w.first, w.last) for w in writes] == [MUTEX_BYTES] * HELD, writes
    # A Trace: usable size 280 here (296 when glibc hands out a slightly larger chunk), at least the 184
    # bytes of its members at r24.10 (src/tracer.h:209-228) whatever the build adds.
    assert min(w.block_bytes for w in writes) >= 184, writes


def test_the_preload_holds_a_freed_block_back_and_its_check_sees_a_write_after_free(tmp_path):
    program = tmp_path / "reuse.c"
    program.write_text(
        "#include <stdio.h>\n#include <stdlib.h>\n"
        "int main(void) {\n"
        "  char* block = malloc(200);\n  free(block);\n"
        "  char* again = malloc(200);\n"                      # glibc hands the same block straight back
        "  printf(\"%s\\n\", again == block ? \"reused\" : \"held\");\n"
        "  block[20] = 1;\n"                                    # a write after free
        "  for (int i = 0; i < 40; ++i) free(malloc(8));\n"   # 40 more frees: the block leaves the ring
        "  return 0;\n}\n")
    binary = tmp_path / "reuse"
    subprocess.run(["gcc", "-O0", "-o", str(binary), str(program)], check=True)
    library = str(free_quarantine.build())
    plain = subprocess.run([str(binary)], capture_output=True, text=True, check=True)
    assert plain.stdout == "reused\n"
    held = subprocess.run([str(binary)], capture_output=True, text=True, check=True,
                          env={**os.environ, "LD_PRELOAD": library})
    assert held.stdout == "held\n" and held.stderr == ""  # no report without the check
    checked = subprocess.run([str(binary)], capture_output=True, text=True, check=True,
                             env={**os.environ, "LD_PRELOAD": library, free_quarantine.CHECK_VARIABLE: "1"})
    writes = free_quarantine.writes_after_free(checked.stderr)
    assert [(w.first, w.last) for w in writes] == [(20, 20)] and writes[0].block_bytes >= 200, checked.stderr


def test_a_server_start_rebuilds_a_stale_preload(tmp_path):
    library = tmp_path / "libfree_quarantine.so"
    env = free_quarantine.preloaded({"LD_PRELOAD": "/opt/other.so"}, library)
    assert env["LD_PRELOAD"] == f"{library}:/opt/other.so" and library.is_file()
    os.utime(library, (0, 0))  # older than its source
    assert free_quarantine.is_stale(library)
    assert free_quarantine.preloaded(env, library)["LD_PRELOAD"] == f"{library}:/opt/other.so"  # once, first
    assert not free_quarantine.is_stale(library)


def test_a_learner_who_cannot_write_build_starts_with_the_library_as_it_is(tmp_path, monkeypatch):
    """A class learner's server: build/ is the instructor's (forced here: root may write anywhere)."""
    library = free_quarantine.build(tmp_path / "preload" / "libfree_quarantine.so")
    os.utime(library, (0, 0))
    monkeypatch.setattr(free_quarantine.os, "access", lambda path, mode: False)
    assert free_quarantine.build(library) == library and free_quarantine.is_stale(library)  # used, not rebuilt
    library.unlink()
    with pytest.raises(BackendBuildError, match="is missing and .* is not writable here") as refused:
        free_quarantine.preloaded({}, library)
    assert "\n" not in str(refused.value) and "lab-backends setup" in str(refused.value)
