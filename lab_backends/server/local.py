"""The ``local`` target: the ``tritonserver`` of the ``nvidia-pytriton`` wheel, as a child process.

It listens on free ports of 127.0.0.1, runs in its own process group (server and Python stubs stop
together), and has a watchdog (``python -m lab_backends.server.watchdog``) so that it never
outlives its owner, even one killed with SIGKILL. A start that loses a port race (another process
took a picked port before Triton bound it) is retried on new ports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import replace
from pathlib import Path

from lab_backends.errors import ServerExitedError
from lab_backends.paths import PROJECT_ROOT, RUNS_DIR
from lab_backends.server import bundle as _bundle
from lab_backends.server import free_quarantine as _free_quarantine
from lab_backends.server import limits as _limits
from lab_backends.server import runs as _runs
from lab_backends.server import sanitizer as _sanitizer
from lab_backends.server.logs import ServerLog
from lab_backends.server.options import ServerOptions
from lab_backends.server.processes import stop_group
from lab_backends.server.readiness import await_ready
from lab_backends.server.repository import model_dirs, preflight
from lab_backends.server.target import Ports, Target

_BIND_FAILURE = re.compile(r"(?i)(address already in use|failed to (start|bind)|Socket '.*' already in use)")
_PORT_RETRIES = 3


class LocalTarget(Target):
    """A tritonserver started here, stopped by PID (with its group) when done or when its owner dies."""

    name = "local"

    def __init__(self, options: ServerOptions, requested_ports: Ports, backend_dir: Path,
                 run_dir: Path | None, startup_timeout_s: float) -> None:
        super().__init__()
        self.options = options
        self.requested_ports = requested_ports
        self.backend_dir = backend_dir
        self._run_dir_arg = run_dir
        self.startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def process(self) -> subprocess.Popen | None:
        return self._process

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def exit_code(self) -> int | None:
        return self._process.poll() if self._process is not None else None

    def start(self) -> bool:
        if self.is_running():
            return False
        bundle = _bundle.find_bundle()
        _bundle.check_model_environment()
        backend_dir = _bundle.prepare_backend_dir(bundle, self.backend_dir)
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        _runs.prune(RUNS_DIR)  # build/runs/ stays bounded
        if self._run_dir_arg:
            self.run_dir = self._run_dir_arg
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.run_dir = Path(tempfile.mkdtemp(prefix="triton-", dir=RUNS_DIR))
        # Models that would hang Triton's load (no model.py: it stays LOADING forever) are left
        # out of --load-model and reported as broken, instead of costing the whole deadline.
        self.preflight = preflight(self.options.model_repositories, self.options.models)
        options = self.options
        if self.preflight:
            wanted = self.options.models or sorted(model_dirs(self.options.model_repositories))
            options = replace(self.options, models=[m for m in wanted if m not in self.preflight])
        deadline = time.monotonic() + self.startup_timeout_s
        for attempt in range(_PORT_RETRIES):
            self.pick_ports(self.requested_ports)
            self._spawn(bundle, options.args(self.http_port, self.grpc_port, self.metrics_port, backend_dir,
                                             cache_dir=bundle.caches))
            try:
                await_ready(self.http_url, self.exit_code, ServerLog(self.log_path, self.options.admin_key),
                            deadline, self.startup_timeout_s, metrics_url=self.metrics_url)
                return True
            except ServerExitedError as exc:
                retry = self.requested_ports == (None, None, None) and _BIND_FAILURE.search(exc.log_tail)
                self.stop()
                if not retry or attempt == _PORT_RETRIES - 1:
                    raise
            except BaseException:
                self.stop()
                raise
        return True  # not reached: the last attempt returns or raises

    def _spawn(self, bundle: _bundle.Bundle, args: list[str]) -> None:
        """Start the server in its own process group, and the watchdog that stops it if we die."""
        assert self.log_path is not None
        env = _bundle.server_environment(bundle)
        # its frees held back a moment: Triton 2.51's trace release writes into a freed Trace; under
        # AddressSanitizer its own quarantine does that, and its runtime must be the first preload
        env = _sanitizer.environment(env) if self.options.address_sanitizer else _free_quarantine.preloaded(env)
        with open(self.log_path, "ab") as log:
            # soft fd limit = hard, dies with us (PR_SET_PDEATHSIG), and no preexec_fn: see server/limits.py
            self._process = _limits.spawn(
                [str(bundle.binary), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=self.run_dir,
                start_new_session=True,  # its own process group: server + stubs stop together
            )
        grace_s = self.options.exit_timeout_s + 5
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "lab_backends.server.watchdog", str(os.getpid()), str(self._process.pid),
             str(grace_s), str(self.log_path)],  # the log path: the watchdog caps the log
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=str(PROJECT_ROOT), start_new_session=True,
        )
        self._finalizer = weakref.finalize(self, _terminate, self._process, self._watchdog, grace_s)

    def stop(self) -> None:
        """Stop the server by PID, and wait for it: server, stubs, watchdog, shm files."""
        if self._finalizer is not None:
            self._finalizer()  # runs _terminate once, then detaches
            self._finalizer = None
        self._process = None
        self._watchdog = None


def _terminate(process: subprocess.Popen, watchdog: subprocess.Popen | None, grace_s: float) -> None:
    """Stop a local server and its group; then the watchdog. Runs once (``weakref.finalize``)."""
    try:
        stop_group(process.pid, grace_s, reap=process.poll)
        process.wait(timeout=5)
    except Exception:  # noqa: BLE001 - best effort at interpreter exit; the watchdog is the backstop
        pass
    if watchdog is not None and watchdog.poll() is None:
        watchdog.terminate()
        try:
            watchdog.wait(timeout=5)
        except subprocess.TimeoutExpired:
            watchdog.kill()
