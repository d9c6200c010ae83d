"""``serve --standby``: a second tritonserver behind the front door, so a crash costs the class under a second.

Why: one request can kill Triton 2.51 (docs/reliability.md), and ``serve --restart`` alone left the class
without Triton for 7-9 s a crash (backoff, then a start that loads every model): a learner's loop of
crashers caused 5 crashes in a minute and the other learners lost 99.9-100 % of their requests. Here two
tritonservers with the same models, options and admin key run behind the door, each on ports of its own
(in the door's network namespace as root: :mod:`netns`). The door's gateway relays every request to the
active one and, when it cannot be reached, to the other, which stays active (:mod:`gateway_failover`);
each server is supervised in a thread of its own (:func:`crash.supervise`: backoff, never gives up, its own
:class:`stub_health.StubWatch`), so the one that died comes back and is the standby from then on.

Why not more (a pool of N, or forking a warm spare): one spare covers one crash at a time, and a second
crash while the first server restarts (a few seconds) finds none; two spares would cost a third server's
memory for the case of two crashes within one restart. A spare's price is its memory (measured in
docs/scale.md: each server holds its own stubs and models) and almost no CPU while idle.

What it cannot move: sequences (their state lives in one server; the gateway refuses the next step of a
sequence whose server died, in one line that says to start again) and model control: a load or unload
reaches the active server only (the standby keeps what ``serve`` loaded at its start; a restart comes back
with the models given to ``serve``, as without ``--standby``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterator

from lab_backends.errors import LabBackendsError
from lab_backends.server.crash import supervise
from lab_backends.server.gateway_failover import write_servers
from lab_backends.server.stub_health import StubWatch
from lab_backends.server.triton_server import TritonServer

#: How long stopping waits for a supervising thread (one may be in a restart: the servers stop regardless).
JOIN_S = 10.0


def spare_for(server: TritonServer) -> TritonServer:
    """A second local server with ``server``'s models, options and admin key, on free ports of its own."""
    options = {f.name: getattr(server.options, f.name) for f in fields(server.options)
               if f.name not in ("model_repositories", "models")}
    return TritonServer(server.options.model_repositories, models=server.options.models, target="local",
                        startup_timeout_s=server.startup_timeout_s, backend_dir=server.backend_dir,
                        allow_broken_models=server.allow_broken_models, **options)


@contextlib.contextmanager
def serving(server: TritonServer, spare: TritonServer | None) -> Iterator[None]:
    """Both servers started together (each picks free ports; a lost port race is retried, local.py), both stopped."""
    failed: list[BaseException] = []

    def start_spare() -> None:
        try:
            spare.start()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread below
            failed.append(exc)

    thread = threading.Thread(target=start_spare, name="standby-start", daemon=True) if spare else None
    try:
        if thread:
            thread.start()
        server.start()
        if thread:
            thread.join()
            if failed:
                raise failed[0]
        yield
    finally:
        if thread and thread.is_alive():
            thread.join(server.startup_timeout_s)
        stopping = threading.Thread(target=spare.stop, name="standby-stop", daemon=True) if spare else None
        if stopping:
            stopping.start()  # both at once: each may wait its exit timeout
        server.stop()
        if stopping:
            stopping.join()


class _Noted:
    """A server whose every restart is written to the servers file (the gateway tells restarted servers apart)."""

    def __init__(self, server: TritonServer, note: Callable[[], None]) -> None:
        self._server, self._note = server, note

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def restart(self) -> "_Noted":
        try:
            self._server.restart()
        finally:
            self._note()
        return self


def keep_serving(server: TritonServer, spare: TritonServer | None, restart: bool, servers_file: Path | None,
                 report: Callable[[str], None]) -> bool:
    """Serve until Ctrl-C or SIGTERM (``True``: asked to stop) or, without ``restart``, a crash (``False``).

    With a ``spare``, each server is supervised in a thread of its own, whatever ``restart`` says.
    """
    if spare is None:
        if restart:  # no bound: never gives up; StubWatch reloads a model whose Python stub died
            supervise(server, report=report, tick=StubWatch(server, report=report).tick)
            return True  # it returns only on Ctrl-C
        while server.is_running():
            time.sleep(0.5)
        return False
    pair = [server, spare]

    def note() -> None:
        if servers_file is not None:
            write_servers(servers_file, [(s.http_port, s.grpc_port, s.pid) for s in pair])

    note()
    stop = threading.Event()
    threads = [threading.Thread(target=_watch, args=(_Noted(s, note), f"tritonserver {i + 1} of 2: ", stop, report),
                                name=f"supervise-{i + 1}", daemon=True) for i, s in enumerate(pair)]
    for thread in threads:
        thread.start()
    try:
        while all(t.is_alive() for t in threads):
            time.sleep(0.5)
        return False  # a supervisor ended on its own: not expected (it never gives up)
    finally:
        stop.set()
        for thread in threads:
            thread.join(JOIN_S)


def _watch(server: Any, prefix: str, stop: threading.Event, report: Callable[[str], None]) -> None:
    def said(message: str) -> None:
        report(prefix + message)

    try:
        supervise(server, report=said, should_stop=stop.is_set, tick=StubWatch(server._server, report=said).tick)
    except LabBackendsError as exc:  # supervise catches a failed restart; anything else ends this thread
        said(f"supervision ended: {exc}")
