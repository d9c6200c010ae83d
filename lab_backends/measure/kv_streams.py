"""Generation requests to the KV-cache models, and the records each token carries.

generate_kv_paged, generate_kv_contiguous and generate_kv_recompute (and generate_kv, the Python backend)
stream one response per token with the model's own record of the step that made it (kvlm spec):
STEP (the token's index), KIND ("prefill" or "decode"), BATCH (sequences that advanced in that
execution), BLOCKS (KV blocks the sequence holds after the step) and FREE_BLOCKS (the pool's). From
these alone a client can tell how many sequences ran at once and what memory each held.

:func:`stream_kv` sends every :class:`KvAsk` at once on ONE gRPC stream (a decoupled model's requests
on one stream are independent: the iterative sequencer gives each its own correlation ID and sequence
slot); an ask with ``cancel_after=n`` goes on a stream of its own, stopped with
``cancel_requests=True`` once it has received n tokens, as a client that goes away. Every wait is
bounded. :class:`KvRun` turns what arrived into tables.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import tritonclient.grpc as grpcclient

from lab_backends.charlm.text import zen
from lab_backends.client.infer import make_inputs
from lab_backends.server.running import RunningServer

PAGED, CONTIGUOUS, RECOMPUTE = "generate_kv_paged", "generate_kv_contiguous", "generate_kv_recompute"
OUTPUTS = ("TEXT", "STEP", "KIND", "BATCH", "BLOCKS", "FREE_BLOCKS")
#: The lesson's mix of lengths: prompts of 12-36 characters (the starts of Zen lines) and 16-64 tokens, every
#: pair once per 16 requests: 28-100 tokens long, 64 on average, against the 256 a contiguous cache reserves.
PROMPT_CHARS, MAX_TOKENS = (12, 20, 28, 36), (16, 32, 48, 64)


@dataclass(frozen=True)
class KvAsk:
    name: str
    prompt: str
    max_tokens: int
    cancel_after: int = 0  # cancel it once it has received this many tokens; 0: never


@dataclass(frozen=True)
class KvToken:
    request: str
    step: int
    text: str
    kind: str
    batch: int
    blocks: int
    free_blocks: int
    t_s: float  # arrival at the client, seconds since the run began


@dataclass
class KvGeneration:
    ask: KvAsk
    sent_s: float = float("nan")
    tokens: list[KvToken] = field(default_factory=list)
    final_s: float = float("nan")
    error: str = ""

    @property
    def text(self) -> str:
        return "".join(t.text for t in sorted(self.tokens, key=lambda t: t.step))

    @property
    def ttft_s(self) -> float:
        return self.tokens[0].t_s - self.sent_s if self.tokens else float("nan")

    @property
    def complete(self) -> bool:
        """Every step 0..max_tokens-1 once, in order, then the FINAL flag, no error."""
        return (not self.error and not np.isnan(self.final_s)
                and [t.step for t in self.tokens] == list(range(self.ask.max_tokens)))


@dataclass
class KvRun:
    model: str
    generations: list[KvGeneration]
    wall_s: float  # first send to last FINAL
    errors: list[str] = field(default_factory=list)  # error responses (a stream's error names no request)

    def __getitem__(self, name: str) -> KvGeneration:
        return next(g for g in self.generations if g.ask.name == name)

    @property
    def complete(self) -> bool:
        return not self.errors and all(g.complete for g in self.generations if not g.ask.cancel_after)

    def records(self) -> pd.DataFrame:
        """One row per token: its request, prompt length and the model's record of its step."""
        rows = [{**t.__dict__, "prompt": len(g.ask.prompt)} for g in self.generations for t in g.tokens]
        return pd.DataFrame(rows, columns=[*KvToken.__dataclass_fields__, "prompt"])

    def max_batch(self) -> int:
        """The most sequences that advanced in one execution (the BATCH record)."""
        return int(self.records()["batch"].max())

    def tokens_per_s(self) -> float:
        return sum(len(g.tokens) for g in self.generations) / self.wall_s

    def waste(self, block_tokens: int) -> float:
        """Reserved-but-unused KV token slots / reserved, over every non-final token record: after step s a
        sequence has cached prompt + s positions in BLOCKS * block_tokens slots. (A final token's BLOCKS is
        0: its blocks were freed with it.)"""
        r = self.records()
        r = r[r["blocks"] > 0]
        reserved = (r["blocks"] * block_tokens).sum()
        return float((reserved - (r["prompt"] + r["step"]).sum()) / reserved) if reserved else float("nan")


def lesson_mix(n: int = 32) -> list[KvAsk]:
    """``n`` requests of the lesson's mixed lengths (:data:`PROMPT_CHARS` x :data:`MAX_TOKENS`), named s0, s1 ..."""
    lines = [line.strip() + " " for line in zen().splitlines() if len(line.strip()) >= max(PROMPT_CHARS)]
    return [KvAsk(f"s{i}", lines[i % len(lines)][:PROMPT_CHARS[i % 4]], MAX_TOKENS[(i // 4) % 4]) for i in range(n)]


class _Collector:
    def __init__(self, asks: Sequence[KvAsk]) -> None:
        self.by_name = {a.name: KvGeneration(a) for a in asks}
        self.errors: list[str] = []
        self.cond = threading.Condition()
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def on_response(self, result, error) -> None:
        at = self.now()
        with self.cond:
            if error is not None:
                self.errors.append(str(error))
            else:
                response = result.get_response()
                g = self.by_name.get(response.id)
                if g is not None and response.outputs:
                    out = {o.name: result.as_numpy(o.name).reshape(-1)[0] for o in response.outputs}
                    g.tokens.append(KvToken(g.ask.name, int(out["STEP"]), out["TEXT"].decode(), out["KIND"].decode(),
                                            int(out["BATCH"]), int(out["BLOCKS"]), int(out["FREE_BLOCKS"]), at))
                if g is not None and response.parameters["triton_final_response"].bool_param:
                    g.final_s = at
            self.cond.notify_all()

    def done(self, names: Sequence[str]) -> bool:
        finished = sum(not np.isnan(self.by_name[n].final_s) for n in names)
        return finished + len(self.errors) >= len(names)

    def send(self, client, model: str, ask: KvAsk) -> None:
        inputs = {"PROMPT": np.array([[ask.prompt.encode()]], dtype=object),
                  "MAX_TOKENS": np.array([[ask.max_tokens]], dtype=np.int32)}
        with self.cond:
            self.by_name[ask.name].sent_s = self.now()
        client.async_stream_infer(model, make_inputs(inputs), request_id=ask.name, enable_empty_final_response=True)


def _cancel_one(collector: _Collector, server: RunningServer, model: str, ask: KvAsk, timeout_s: float) -> None:
    """An ask on its own stream, cancelled by its client after ``cancel_after`` tokens."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=collector.on_response)
    g = collector.by_name[ask.name]
    try:
        collector.send(client, model, ask)
        with collector.cond:
            if not collector.cond.wait_for(lambda: len(g.tokens) >= ask.cancel_after, timeout=timeout_s):
                g.error = f"received no {ask.cancel_after} tokens within {timeout_s:g} s"
        client.stop_stream(cancel_requests=True)
        with collector.cond:
            g.error = g.error or f"cancelled by its client after {len(g.tokens)} tokens"
    finally:
        client.close()


def stream_kv(server: RunningServer, model: str, asks: Sequence[KvAsk], timeout_s: float = 120.0) -> KvRun:
    """Send every ask at once (one stream; cancelled ones on streams of their own); collect every token."""
    collector = _Collector(asks)
    plain = [a for a in asks if not a.cancel_after]
    cancels = [threading.Thread(target=_cancel_one, args=(collector, server, model, a, timeout_s), daemon=True)
               for a in asks if a.cancel_after]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=collector.on_response)
    try:
        for t in cancels:
            t.start()
        for ask in plain:
            collector.send(client, model, ask)
        with collector.cond:
            finished = collector.cond.wait_for(lambda: collector.done([a.name for a in plain]), timeout=timeout_s)
        for t in cancels:
            t.join(timeout_s)
        with collector.cond:  # before the stream stops: stopping it may report its own cancellation
            generations = list(collector.by_name.values())
            errors = list(collector.errors)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    if not finished:
        errors.append(f"not every request finished within {timeout_s:g} s")
    ends = [g.final_s for g in generations if not np.isnan(g.final_s)]
    starts = [g.sent_s for g in generations if not np.isnan(g.sent_s)]
    wall_s = max(ends) - min(starts) if ends and starts else float("nan")
    return KvRun(model, generations, wall_s, errors)


def free_blocks_after(server: RunningServer, model: str, whole: int = -1, deadline_s: float = 0.0) -> int:
    """FREE_BLOCKS in the record of a 1-token probe: its own block is freed with its last token, so once every
    other sequence has ended it reads the whole pool. Sent again every 0.2 s until it reads ``whole`` or
    ``deadline_s`` has passed (a cancellation reaches the model asynchronously); -1 if the probe got no token."""
    end = time.monotonic() + deadline_s
    while True:
        tokens = stream_kv(server, model, [KvAsk("probe", "Beautiful", 1)], timeout_s=15)["probe"].tokens
        free = tokens[-1].free_blocks if tokens else -1
        if free == whole or not tokens or time.monotonic() >= end:
            return free
        time.sleep(0.2)
