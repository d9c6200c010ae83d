"""A load request whose uploaded file has a 256-character name aborts Triton 2.51 (upstream defect).

NVIDIA's main-branch ``simple_grpc_model_control.py`` sends exactly this (``files={"file:" +
"A" * 256: b"a"}`` with ``config="{}"``) and expects an error answer; Triton 2.51 instead dies
(SIGABRT, log: ``what():  filesystem error: status: File name too long [/tmp/folderXXXXXX/AAA…]``):
core ``model_repository_manager.cc`` line 118 at r24.10 calls the throwing
``std::filesystem::weakly_canonical`` (its ``status`` call fails), and nothing catches it (fixed
upstream in core cec19b9, "Safely handle filesystem exception", April 2026, after 24.10).

Pinned twice on throw-away servers (``upstream``: both FAIL the day an upgrade answers instead):
from Python (``ServerCrashed`` quotes the log's ``what():`` line) and under ``lab-backends serve``
(the report says the same, and when ``--restart`` would restart, with no Python-API advice). Our
own loads refuse such a name before sending (``loading.refuse_long_file_names``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from lab_backends.errors import ModelLoadError, ServerCrashed
from lab_backends.server.crash import crashed
from lab_backends.server.loading import refuse_long_file_names
from lab_backends.server.processes import terminate
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll
from tests.reliability.conftest import TEST_MODELS

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parents[2]
#: What NVIDIA's example sends: one path component of 256 bytes, one over Linux's NAME_MAX.
LONG_FILE = {"file:" + "A" * 256: b"a"}


def test_our_loads_refuse_a_long_file_name_before_sending(rel_server):
    pid = rel_server.pid
    with pytest.raises(ModelLoadError) as caught:
        rel_server.load_model("rel_double", config="{}", files=LONG_FILE)
    message = str(caught.value)
    assert "\n" not in message and "refused before sending" in message and "256 bytes" in message, message
    assert rel_server.pid == pid and rel_server.model_ready("rel_double")  # nothing was sent
    refuse_long_file_names("m", {"file:1/" + "B" * 255: b"", "config": b"{}"})  # 255 is allowed
    with pytest.raises(ModelLoadError, match="300 bytes"):
        refuse_long_file_names("m", {"file:1/" + "é" * 150: b""})  # bytes, not characters
    with pytest.raises(ModelLoadError, match="4095 bytes, over 3840"):  # a 4095-byte path aborts 2.51 too
        refuse_long_file_names("m", {"file:" + "/".join(["C" * 255] * 16): b""})
    refuse_long_file_names("m", {"file:" + "/".join(["C" * 255] * 15): b""})  # 3839 bytes: answered, no abort


@pytest.mark.upstream
def test_a_long_file_name_in_a_load_aborts_tritonserver():
    with TritonServer(TEST_MODELS, models=["rel_double"], startup_timeout_s=120) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            client.load_model("rel_double", headers=server.grpc_admin_headers, config="{}", files=LONG_FILE)
            answer = "no error"
        except Exception as exc:  # noqa: BLE001 - whatever it answered, if it answered
            answer = repr(exc)
        finally:
            client.close()
        code = poll(lambda: crashed(server), lambda c: c is not None, 30, 0.1)
        assert code == -signal.SIGABRT, (
            f"UPSTREAM FIXED? tritonserver survived a 256-character file name in a load (exit {code}, answered "
            f"{answer}): drop the refusal in loading.refuse_long_file_names and this row of docs/reliability.md"
        )
        with pytest.raises(ServerCrashed) as caught:
            server.http_client  # the next call of any kind explains the death
        message = str(caught.value).split("\nlast log lines:")[0]
        assert "SIGABRT" in message and "restart()" in message
        assert "std::filesystem::__cxx11::filesystem_error" in message and "File name too long" in message, message
        assert "what():" in message and "bad_alloc" not in message


@pytest.mark.upstream
def test_serve_reports_the_abort_in_the_logs_words(tmp_path):
    key_file, out, err = tmp_path / "admin.key", tmp_path / "serve.out", tmp_path / "serve.err"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_ADMIN_KEY", "TRITON_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab_backends.cli", "serve", "--model-repository", str(TEST_MODELS),
         "--model", "rel_double", "--admin-key-file", str(key_file)],
        cwd=ROOT, stdout=open(out, "w"), stderr=open(err, "w"), env=env,
    )
    try:
        text = poll(out.read_text, lambda t: "Ctrl-C stops" in t or proc.poll() is not None, 120, 0.2)
        assert "Ctrl-C stops" in text, f"serve did not start:\n{text}\n{err.read_text()}"
        http = text.split("HTTP/REST : http://")[1].split()[0]
        client = httpclient.InferenceServerClient(http, network_timeout=30)
        try:  # over HTTP this time (the Python test above sends it over gRPC)
            client.load_model("rel_double", headers={"admin-key": key_file.read_text().strip()}, config="{}",
                              files=LONG_FILE)
        except Exception:  # noqa: BLE001 - the connection dies with the server
            pass
        code = poll(proc.poll, lambda c: c is not None, 30, 0.2)
        report = err.read_text()
        assert code == 1, f"UPSTREAM FIXED? serve still runs (exit {code}) after the long file name:\n{report}"
        said = report.split("\nlast log lines:")[0]
        assert "SIGABRT" in said and "File name too long" in said and "what():" in said, report
        assert "restart()" not in said and "lab-backends serve --restart" in said, report
        assert "never gives up" in said, report
    finally:
        terminate(proc)
