"""SIGTERM stops a ``lab-backends`` command even while it waits on tritonclient.http (gevent).

Run 83 of ``make test`` (and one flake hunt before it) saw ``serve --front-door --restart`` ignore the
SIGTERM of its test's teardown: it printed a lone ``_StopRequested`` traceback and a time stamp, and was
SIGKILLed 30 s later. The stamp is gevent's: the signal arrived while supervision's stub check waited on
an HTTP answer, so the handler raised inside gevent's hub, which prints and swallows every error that is
not a KeyboardInterrupt, SystemExit or SystemError (``gevent.hub.Hub.SYSTEM_ERROR``). ``StopRequested``
is a KeyboardInterrupt now. This test puts a process in exactly that wait, by construction: the test
holds the socket, reads the whole request, and only then sends SIGTERM, with no answer ever coming.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from lab_backends.paths import PROJECT_ROOT

#: A command's main thread, blocked in tritonclient.http until its network timeout (60 s) unless stopped.
WAITER = """
import sys
import tritonclient.http as httpclient
from lab_backends.server.stop_signal import StopRequested, stop_on_sigterm
stop_on_sigterm()
client = httpclient.InferenceServerClient(sys.argv[1], network_timeout=60)
try:
    client.is_server_live()
    print("answered", flush=True)
except StopRequested:
    print("stopped", flush=True)
except Exception as exc:
    print(f"failed: {type(exc).__name__}", flush=True)
"""


def test_sigterm_during_a_tritonclient_http_wait_stops_the_command() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(60)
        port = listener.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-c", WAITER, f"127.0.0.1:{port}"], cwd=PROJECT_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            conn, _ = listener.accept()
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:  # the whole request is here: the client now waits for us
                    chunk = conn.recv(4096)
                    assert chunk, "the client closed its connection before sending its request"
                    request += chunk
                proc.send_signal(signal.SIGTERM)
                started = time.monotonic()
                out, err = proc.communicate(timeout=30)  # the old handler: still waiting at 30 s
            took = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert out.strip() == "stopped" and "Traceback" not in err, (out, err)
    assert took < 10, took
