"""The gateway's choice between ``serve --standby``'s two servers and its book of sequences, without a server.

What a real crash does to them is tested in tests/reliability/test_standby.py; here each rule alone:
which requests name a sequence, where a sequence's next step goes, when it is refused as lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tritonclient.grpc import service_pb2

from lab_backends.server import gateway_failover
from lab_backends.server.gateway_failover import LOST, Failover, Upstream, grpc_step, http_step, write_servers

INFER = "/v2/models/running_mean/infer"


def _body(**params) -> bytes:
    return json.dumps({"parameters": params, "inputs": []}).encode()


def test_an_http_request_names_its_sequence_in_json_or_in_a_binary_requests_header():
    step = http_step(INFER, {}, _body(sequence_id=7, sequence_start=True))
    assert (step.model, step.cid, step.start, step.end) == ("running_mean", 7, True, False)
    header = _body(sequence_id="ada:1", sequence_end=True)
    step = http_step("/v2/models/running_mean/versions/1/infer", {"Inference-Header-Content-Length": str(len(header))},
                     header + b"\x00sequence_id-like binary data")
    assert (step.cid, step.start, step.end) == ("ada:1", False, True)
    assert http_step(INFER, {}, _body(sequence_id=0)) is None  # 0: no sequence, as Triton reads it
    assert http_step(INFER, {}, b'{"inputs": []}') is None
    assert http_step("/v2/repository/index", {}, _body(sequence_id=7)) is None
    assert http_step(INFER, {}, b'{"parameters": {"sequence_id": 7') is None  # not JSON: Triton names the fault


def test_a_grpc_request_names_its_sequence_and_int64_wraps_to_the_uint64_http_sends():
    request = service_pb2.ModelInferRequest(model_name="running_mean")
    request.parameters["sequence_id"].int64_param = -1
    request.parameters["sequence_start"].bool_param = True
    step = grpc_step(request.SerializeToString())
    assert (step.model, step.cid, step.start) == ("running_mean", (1 << 64) - 1, True)
    assert step.key == http_step(INFER, {}, _body(sequence_id=(1 << 64) - 1)).key
    assert grpc_step(service_pb2.ModelInferRequest(model_name="m").SerializeToString()) is None


@pytest.fixture
def failover(tmp_path):
    servers = tmp_path / "servers.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its PID is gone
    write_servers(servers, [(8000, 8001, os.getpid()), (9000, 9001, dead.pid)])
    return Failover([Upstream(8000, 8001), Upstream(9000, 9001)], str(servers)), dead.pid


def test_a_sequence_stays_on_its_server_and_is_refused_as_lost_once_that_server_died(failover):
    failover, _ = failover
    start = http_step(INFER, {}, _body(sequence_id=5, sequence_start=True))
    assert failover.route(start) == ([0, 1], None)  # a START goes where anything goes
    failover.answered(1, start)  # ... and was answered by server 1, whose PID is dead
    assert failover.active == 1
    step = http_step(INFER, {}, _body(sequence_id=5))
    slots, refusal = failover.route(step)
    assert slots == [] and (refusal.status, refusal.message) == (400, LOST.format(cid=5))
    assert refusal.grpc_code == "INVALID_ARGUMENT"
    assert failover.route(step) == ([1, 0], None)  # told once: then the servers answer as Triton does


def test_a_live_sequence_goes_only_to_its_server_and_is_forgotten_at_its_end(failover):
    failover, _ = failover
    failover.answered(0, http_step(INFER, {}, _body(sequence_id=6, sequence_start=True)))
    failover.active = 1  # the other server became active meanwhile
    step = http_step(INFER, {}, _body(sequence_id=6))
    assert failover.route(step) == ([0], None)
    failover.answered(0, step)
    assert failover.active == 1, "a sequence's step on its own server is no failover"
    end = http_step(INFER, {}, _body(sequence_id=6, sequence_end=True))
    failover.answered(0, end)
    assert failover.route(step) == ([1, 0], None)
    assert failover.unreachable(step) is None  # not booked: no "lost" for a sequence the gateway never saw


def test_the_book_of_sequences_is_bounded(failover, monkeypatch):
    failover, _ = failover
    monkeypatch.setattr(gateway_failover, "MAX_SEQUENCES", 3)
    for cid in range(1, 6):
        failover.answered(1, http_step(INFER, {}, _body(sequence_id=cid, sequence_start=True)))
    assert failover.route(http_step(INFER, {}, _body(sequence_id=1)))[1] is None  # forgotten: relayed
    assert failover.route(http_step(INFER, {}, _body(sequence_id=5)))[1] is not None  # booked: its server died


def test_the_active_server_is_written_where_serve_wrote_the_servers(failover, tmp_path):
    failover, _ = failover
    failover.answered(1, None)
    assert json.loads((tmp_path / "active.json").read_text())["slot"] == 1
    failover.down(1)
    assert json.loads((tmp_path / "active.json").read_text())["http_port"] == 8000
