"""lessons/shared_memory.py against a real server: four ways agree, Triton's four errors, nothing left behind.

One embedded server (``echo``) for the module. Every test names its regions with its own token, so
it checks ``/dev/shm`` and the server's registry for exactly those names.
"""

from __future__ import annotations

import uuid

import numpy as np
import pandas as pd
import pytest
from tritonclient.utils.shared_memory import SharedMemoryException

from lab_backends.lessons import shared_memory
from lab_backends.server.triton_server import TritonServer


@pytest.fixture(scope="module")
def server():
    with TritonServer(models=["echo"], target="local") as running:
        yield running


def _token() -> str:
    return uuid.uuid4().hex[:8]


def _assert_clean(server: TritonServer, token: str) -> None:
    prefix = f"{shared_memory.PREFIX}_{token}"
    assert shared_memory.leftovers(prefix) == [], "a region file is left in /dev/shm"
    assert [n for n in shared_memory.registered(server) if n.startswith(prefix)] == [], "a region is still registered"


def test_four_ways_agree_and_shared_memory_sends_no_tensor_bytes(server: TritonServer) -> None:
    token = _token()
    tensor = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)  # 256 KiB
    result = shared_memory.compare_ways(server, tensor, repeats=3, token=token)
    assert list(result.table.index) == ["REST, JSON tensors", "REST, binary tensors", "gRPC (protobuf, raw bytes)",
                                        shared_memory.SHM_WAY]
    for way, output in result.outputs.items():
        assert np.array_equal(output, tensor), f"{way} returned another tensor"
    shm = result.table.loc[shared_memory.SHM_WAY]
    assert shm["request_bytes"] < 1024 and shm["response_bytes"] < 1024, shm
    others = result.table.drop(shared_memory.SHM_WAY)
    assert (others["request_bytes"] >= tensor.nbytes).all() and (others["response_bytes"] >= tensor.nbytes).all()
    assert all(name in result.shm_request for name in result.region_names)
    assert "shared_memory_region" in result.shm_request and '"data"' not in result.shm_request
    assert len(result.region_names) == 2 and all(name.startswith(f"lab_shm_{token}") for name in result.region_names)
    _assert_clean(server, token)


def test_four_mistakes_get_tritons_own_errors(server: TritonServer) -> None:
    token = _token()
    failures = shared_memory.failure_modes(server, n=1024, token=token)
    assert list(failures.index) == list(shared_memory.FAILURES)
    assert failures["matches"].all(), failures[["error", "expected"]].to_dict("index")
    assert "lab_shm_never_registered" in failures.loc["unregistered region", "error"]
    assert f"lab_shm_{token}_input" in failures.loc["input offset + size past the region", "error"]
    # 4096 bytes stated for the 2048-byte region: refused on the region's bounds, before the model runs.
    assert f"lab_shm_{token}_small" in failures.loc["output size past the region", "error"]
    # 2048 bytes stated for the 4096-byte region: the allocator compares the output with the STATED size,
    # not the region's (http_server.cc 1229-1243 at r24.10).
    assert "(2048 bytes) should be at least 4096 bytes" in failures.loc["output size stated too small", "error"]
    _assert_clean(server, token)


def _ways(shm: tuple[float, float], binary: tuple[float, float]) -> pd.DataFrame:
    rows = {"REST, JSON tensors": (40.0, 50.0), "REST, binary tensors": binary,
            "gRPC (protobuf, raw bytes)": (3.0, 4.0), shared_memory.SHM_WAY: shm}
    return pd.DataFrame([{"variant": k, "p50_ms": a, "p90_ms": b} for k, (a, b) in rows.items()]).set_index("variant")


@pytest.mark.parametrize("shm, binary, verdict, sign", [
    ((0.7, 0.8), (3.0, 6.0), "shared memory was faster", "+2.30 ms"),
    ((2.0, 3.5), (1.9, 2.4), "no clear difference", "-0.10 ms"),  # a learner's run: not faster at p50
    ((3.0, 3.2), (1.0, 1.5), "shared memory was slower", "-2.00 ms"),
])
def test_latency_lines_say_what_this_run_measured(shm, binary, verdict, sign) -> None:
    lines = shared_memory.latency_lines(_ways(shm, binary), 1 << 20)
    assert verdict in lines[1], lines
    assert sign in lines[2] and "1.00 MiB" in lines[2], lines
    assert lines[3].startswith("p50 relative to shared memory: REST, JSON tensors")


def test_regions_are_unregistered_and_destroyed_after_an_exception(server: TritonServer) -> None:
    token = _token()
    with pytest.raises(RuntimeError, match="mid-way"):
        with shared_memory.regions(server, {"a": 4096, "b": 64}, token) as made:
            assert all(region.path.exists() for region in made.values())
            assert {r.name for r in made.values()} <= set(shared_memory.registered(server))
            made["a"].write(np.ones(1024, np.float32))
            raise RuntimeError("mid-way")
    _assert_clean(server, token)


def test_a_failing_setup_undoes_what_it_had_done(server: TritonServer) -> None:
    """The second ``regions`` fails on its second create (the key exists): its first region is undone,
    the outer one stays until its own ``with`` ends."""
    token = _token()
    with shared_memory.regions(server, {"taken": 64}, token) as outer:
        with pytest.raises(SharedMemoryException, match="unable to create"):
            with shared_memory.regions(server, {"fresh": 64, "taken": 64}, token):
                pass
        assert shared_memory.leftovers(f"lab_shm_{token}") == [outer["taken"].path.name]
        assert [n for n in shared_memory.registered(server) if n.startswith(f"lab_shm_{token}")] == [
            outer["taken"].name]
    _assert_clean(server, token)


def test_a_shared_memory_answer_carries_no_tensor(server: TritonServer) -> None:
    """tritonclient's own infer: the response only describes the output, which is read from its region."""
    token = _token()
    tensor = np.arange(256, dtype=np.float32)
    with shared_memory.regions(server, {"in": tensor.nbytes, "out": tensor.nbytes}, token) as r:
        r["in"].write(tensor)
        inputs, outputs = shared_memory._shm_tensors(tensor, r["in"].name, r["out"].name, tensor.nbytes)
        answer = server.http_client.infer("echo", inputs, outputs=outputs)
        described = answer.get_output("OUTPUT0")  # name, datatype and shape: no data, no binary part
        assert described["shape"] == [256] and "data" not in described, described
        assert "binary_data_size" not in described.get("parameters", {}), described
        assert np.array_equal(r["out"].read(np.float32, [256]), tensor)
    _assert_clean(server, token)


def test_a_server_elsewhere_is_replaced_by_an_embedded_one() -> None:
    """A server at TRITON_URL cannot map this machine's /dev/shm: the section gets its own local echo."""

    class Elsewhere:
        target = "remote"

    local = shared_memory.same_machine(Elsewhere())
    try:
        assert local.target == "local" and local.model_ready("echo")
    finally:
        local.stop()


IN_USE = "Cannot unregister shared memory region 'r', it is currently in use."


class _HeldRegion:
    """A client whose server still holds the region for ``held`` attempts (the branch a busy machine
    takes: Triton's own refusal text, server ``src/shared_memory_manager.cc`` 690-693 at r24.10)."""

    def __init__(self, held: int, error: str = IN_USE) -> None:
        self.held, self.error, self.calls = held, error, 0

    def unregister_system_shared_memory(self, name: str, headers=None) -> None:
        self.calls += 1
        if self.calls <= self.held:
            raise shared_memory.InferenceServerException(self.error)


def test_unregister_waits_for_a_region_still_in_use() -> None:
    client = _HeldRegion(held=3)
    shared_memory.unregister(client, "r")
    assert client.calls == 4


@pytest.mark.parametrize("held, error, calls", [
    (10**6, IN_USE, None),  # never let go
    (1, "Unable to find system shared memory region: 'r'", 1),  # another refusal: no retry
])
def test_unregister_raises_what_it_cannot_wait_out(monkeypatch, held, error, calls) -> None:
    monkeypatch.setattr(shared_memory, "RELEASE_WAIT_S", 0.1)
    client = _HeldRegion(held, error)
    with pytest.raises(shared_memory.InferenceServerException, match=error.split(":")[0][:30]):
        shared_memory.unregister(client, "r")
    assert client.calls == calls if calls is not None else client.calls > 1
