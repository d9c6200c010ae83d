"""``lab-backends bench door``: one learner floods the class's door; how another learner fares, without and with shares.

Two runs of ``lab-backends serve --front-door`` on ``cost_model`` (lesson 01's model, dynamic
batching, 10 ms + 0.2 ms a row), run as a class runs it: without ``--learner-secret-file`` (the door
as it was, nothing limited), then with it (each learner's share at ``serve``'s defaults:
``door_share.FairShare``). In each run learner ``bea`` sends one request at a time, with a short pause
in between (a learner working through lesson 01), first alone, then while learner ``cyd`` floods
the door from :data:`FLOOD_THREADS` threads, each sending its next request as soon as the last was
answered (refused ones too), for :data:`FLOOD_S` seconds: bounded, like every load loop here.

Printed and written to ``bench/door_share.csv``: per run and phase, bea's requests and p50/p99 (ms,
at the client), and cyd's answered and refused requests. Both learners' requests carry their
tokens (:mod:`lab_backends.learner`), so the door's log names them in both runs.

What the door can and cannot do: it caps the places cyd holds in tritonserver's queue, so bea's
request waits behind fewer of cyd's. It does not cap cyd's CPU: a refused request comes back at
once, and cyd's threads send the next one, on the same two cores. That share is a cgroup's job
(issue 38), not the door's.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from lab_backends import learner, rest
from lab_backends.errors import LabBackendsError
from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.admin import write_key_file
from lab_backends.server.processes import terminate
from lab_backends.waiting import poll

MODEL = "cost_model"
FLOOD_THREADS = 48
FLOOD_S = 12.0
PAUSE_S = 0.02
COLUMNS = ["door", "phase", "bea_requests", "bea_p50_ms", "bea_p99_ms", "cyd_answered", "cyd_refused"]
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}).encode()


@dataclass(frozen=True)
class Phase:
    """One phase of one run: bea's latencies (ms) and what cyd got."""

    door: str
    phase: str
    bea_ms: tuple[float, ...]
    cyd_answered: int = 0
    cyd_refused: int = 0

    def row(self) -> dict:
        ms = np.asarray(self.bea_ms)
        return {"door": self.door, "phase": self.phase, "bea_requests": len(ms),
                "bea_p50_ms": float(np.percentile(ms, 50)), "bea_p99_ms": float(np.percentile(ms, 99)),
                "cyd_answered": self.cyd_answered, "cyd_refused": self.cyd_refused}


class DoorServe:
    """``lab-backends serve --front-door`` in a child process, stopped by PID.

    ``models``: what it loads (``()``: every model of the repository); ``restricted``: the APIs behind
    the key (``None``: all of them, serve's default); ``secret``: the learners' (``None``: no shares).
    """

    def __init__(self, workdir: Path, secret: str | None, models: tuple[str, ...] = (MODEL,),
                 restricted: tuple[str, ...] | None = None) -> None:
        flags = ["--front-door", "--admin-key-file", str(workdir / "admin.key"), *[f"--model={m}" for m in models]]
        flags += ["--restricted-apis", ",".join(restricted)] if restricted is not None else []
        if secret is not None:
            flags += ["--learner-secret-file", str(write_key_file(workdir / "learners.secret", secret))]
        self.out = workdir / "serve.out"
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "lab_backends.cli", "serve", *flags], cwd=PROJECT_ROOT,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            text = poll(self.out.read_text, lambda t: "Ctrl-C stops" in t or self.proc.poll() is not None, 180, 0.2)
            found = re.search(r"HTTP/REST : http://(\S+)", text)
            if "Ctrl-C stops" not in text or found is None:
                raise LabBackendsError(f"serve --front-door did not start for the door bench: {text[-800:]}")
        except BaseException:
            self.stop()
            raise
        self.http = found.group(1)
        self.grpc = re.search(r"gRPC +: (\S+)", text).group(1)
        self.metrics = re.search(r"metrics +: (\S+)", text).group(1)
        self.url = f"http://{self.http}/v2/models/{MODEL}/infer"

    def stop(self) -> None:
        terminate(self.proc)


def _send(url: str, headers: dict[str, str]) -> tuple[int, float]:
    t0 = time.perf_counter()
    status, _ = rest.request(url, "POST", BODY, headers, timeout=60)
    return status, (time.perf_counter() - t0) * 1000


def _bea(url: str, headers: dict[str, str], until: Callable[[], bool]) -> list[float]:
    """bea's requests, one at a time with a pause, until ``until()``; every one must be answered."""
    times = []
    while not until():
        status, ms = _send(url, headers)
        if status != 200:
            raise LabBackendsError(f"bea's request got HTTP {status} during the door bench: her share must hold")
        times.append(ms)
        time.sleep(PAUSE_S)
    return times


def _flood(url: str, headers: dict[str, str], stop: threading.Event) -> tuple[int, int]:
    """cyd's closed loop from :data:`FLOOD_THREADS` threads until ``stop``: (answered, refused)."""
    def one() -> tuple[int, int]:
        answered = refused = 0
        while not stop.is_set():
            status, _ = _send(url, headers)
            answered += status == 200
            refused += status == 429
        return answered, refused

    with concurrent.futures.ThreadPoolExecutor(FLOOD_THREADS) as pool:
        counts = list(pool.map(lambda _: one(), range(FLOOD_THREADS)))
    return sum(a for a, _ in counts), sum(r for _, r in counts)


def run_door(door: str, secret: str | None, workdir: Path, flood_s: float) -> list[Phase]:
    """bea alone, then bea during cyd's flood, through one door."""
    tokens = secret or learner.new_secret()  # without shares the door checks no token: any will do
    heads = {name: {"Content-Type": "application/json", learner.LEARNER_HEADER: name,
                    learner.TOKEN_HEADER: learner.token_for(tokens, name)} for name in ("bea", "cyd")}
    serve = DoorServe(workdir, secret)
    try:
        for _ in range(20):  # warm-up: the model's first executions
            _send(serve.url, heads["bea"])
        t_end = time.monotonic() + flood_s / 2
        alone = _bea(serve.url, heads["bea"], lambda: time.monotonic() > t_end)
        stop = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            flood = pool.submit(_flood, serve.url, heads["cyd"], stop)
            time.sleep(1.0)  # the flood fills the queue first
            t_end = time.monotonic() + flood_s
            during = _bea(serve.url, heads["bea"], lambda: time.monotonic() > t_end or flood.done())
            stop.set()
            answered, refused = flood.result()
    finally:
        serve.stop()
    return [Phase(door, "bea alone", tuple(alone)), Phase(door, "bea during cyd's flood", tuple(during),
                                                             answered, refused)]


def door_bench(out_dir: str | Path = PROJECT_ROOT / "bench", quick: bool = False,
               log: Callable[[str], None] = print) -> pd.DataFrame:
    """Both doors, one after the other, in one run; writes ``door_share.csv`` and prints the table."""
    flood_s = FLOOD_S / 3 if quick else FLOOD_S
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory(prefix="door-bench-") as tmp:
        for door, secret in (("no shares", None), ("shares", learner.new_secret())):
            workdir = Path(tmp) / door.replace(" ", "-")
            workdir.mkdir(mode=0o700)
            phases += run_door(door, secret, workdir, flood_s)
            log(f"{door}: " + "; ".join(f"{p.phase}: p50 {p.row()['bea_p50_ms']:.1f} ms, p99 "
                                         f"{p.row()['bea_p99_ms']:.1f} ms" for p in phases[-2:]))
    frame = pd.DataFrame([p.row() for p in phases])[COLUMNS]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "door_share.csv", index=False, float_format="%.2f")
    log(frame.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    log(f"written: {out / 'door_share.csv'} (flood: {FLOOD_THREADS} threads for {flood_s:.0f} s, "
        f"{os.cpu_count()} cores)")
    return frame

