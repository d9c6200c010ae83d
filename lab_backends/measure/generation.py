"""Generation requests on concurrent gRPC streams, and what the model's own records say about them.

``generate_static`` and ``generate_iterative`` (model_repository/) stream one response per token,
each carrying the model's records of the step that made it: EXEC (the instance's execution
counter), STEP (the token's index in its request) and BATCH (the requests in that forward pass).
So the client, without any server-side log, can tell which step of which request ran in which
execution, and when each token arrived.

:func:`run_streams` sends :class:`Ask` lists on concurrent gRPC streams (one tritonclient stream
per list, one request in flight per stream, the next sent when the previous one's FINAL arrived:
a closed loop). An ``Ask`` may wait until another request has received some tokens
(``after=("long", 2)``, or several such pairs): arrivals are then arranged by the model's records,
not by sleeps, so "a request that arrived while another was generating" holds on a slow machine too.
An ``Ask`` with ``cancel_after=n`` is cancelled by its client once it has received n tokens (the
stream is stopped with ``cancel_requests=True``, as a client that goes away does). Every wait is
bounded. :class:`GenerationRun` turns the collected tokens into tables: per request (time to first
token, latency, tokens/s) and the timeline (request, step, execution, batch, arrival time).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import tritonclient.grpc as grpcclient

from lab_backends.client.infer import make_inputs
from lab_backends.server.running import RunningServer

STATIC, ITERATIVE = "generate_static", "generate_iterative"
DEFAULT_PROMPT = "Beautiful is better than ugly.\n"  # a line of the Zen: the model recites what follows
#: Eight lengths spread over 4..64 tokens: the mixed lengths of the comparison and the bench.
LENGTHS = (4, 12, 21, 30, 38, 47, 55, 64)
#: How long a stream waits after its last FINAL for a stray response (there must be none).
GRACE_S = 0.05


@dataclass(frozen=True)
class Ask:
    """One generation request: its id, how many tokens, the prompt, and what it waits for before sending."""

    name: str
    max_tokens: int
    prompt: str = DEFAULT_PROMPT
    #: (request, tokens): send once that request has received as many (or finished); several pairs: all of them
    after: tuple[str, int] | tuple[tuple[str, int], ...] | None = None
    cancel_after: int = 0  # cancel it (stop its stream) once it has received this many tokens; 0: never

    def waits_for(self) -> tuple[tuple[str, int], ...]:
        """The (request, tokens) pairs this request is sent after."""
        if self.after is None:
            return ()
        return (self.after,) if isinstance(self.after[0], str) else tuple(self.after)  # type: ignore[return-value]


@dataclass(frozen=True)
class Token:
    """One streamed token with the model's record of the step that produced it."""

    request: str
    step: int
    text: str
    execution: int
    batch: int
    t_s: float  # arrival at the client, seconds since the run began
    nulls: int = 0  # null requests the execution carried (generate_iterative's record; skipped by the model)


@dataclass
class Generation:
    """Everything one request's stream delivered."""

    ask: Ask
    sent_s: float = float("nan")
    tokens: list[Token] = field(default_factory=list)
    final_s: float = float("nan")
    finals: int = 0
    late: int = 0  # responses after the FINAL one (a correct model sends none)
    error: str = ""
    cancelled_s: float = float("nan")  # when its client cancelled it (Ask.cancel_after)

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)

    @property
    def ttft_s(self) -> float:
        return self.tokens[0].t_s - self.sent_s if self.tokens else float("nan")

    @property
    def latency_s(self) -> float:
        return self.final_s - self.sent_s

    @property
    def complete(self) -> bool:
        """Exactly its tokens, in order, then one FINAL flag (on the last token), nothing after, no error."""
        return (not self.error and self.finals == 1 and self.late == 0
                and [t.step for t in self.tokens] == list(range(self.ask.max_tokens)))

    @property
    def executions(self) -> list[int]:
        return [t.execution for t in self.tokens]


@dataclass
class GenerationRun:
    """One run of :func:`run_streams` against one model."""

    model: str
    generations: list[Generation]
    wall_s: float

    def __getitem__(self, name: str) -> Generation:
        return next(g for g in self.generations if g.ask.name == name)

    @property
    def complete(self) -> bool:
        return all(g.complete for g in self.generations)

    def requests(self) -> pd.DataFrame:
        """One row per request: length, time to first token, latency, tokens/s, executions it ran in."""
        rows = [{"request": g.ask.name, "max_tokens": g.ask.max_tokens, "tokens": len(g.tokens),
                 "sent_ms": g.sent_s * 1000, "ttft_ms": g.ttft_s * 1000, "latency_ms": g.latency_s * 1000,
                 "tokens_per_s": len(g.tokens) / g.latency_s if g.latency_s > 0 else float("nan"),
                 "first_exec": min(g.executions, default=-1), "last_exec": max(g.executions, default=-1),
                 "complete": g.complete, "error": g.error} for g in self.generations]
        return pd.DataFrame(rows)

    def timeline(self) -> pd.DataFrame:
        """One row per token: which step of which request ran in which execution, with how many others."""
        rows = [{"request": t.request, "step": t.step, "execution": t.execution, "batch": t.batch,
                 "nulls": t.nulls, "t_ms": t.t_s * 1000, "text": t.text} for g in self.generations for t in g.tokens]
        return pd.DataFrame(rows, columns=["request", "step", "execution", "batch", "nulls", "t_ms", "text"])

    def forward_passes(self) -> int:
        """Forward passes the model ran, from its records: per execution, the most steps one request ran there.

        A static execution runs as many passes as its longest member has tokens; an iterative one runs one.
        """
        steps = self.timeline()
        if not len(steps):
            return 0
        return int(steps.groupby(["execution", "request"]).size().groupby("execution").max().sum())

    def summary(self) -> dict[str, float]:
        """Tokens/s over the run, TTFT and latency percentiles, executions, their mean batch, tokens per pass."""
        table, steps = self.requests(), self.timeline()
        tokens, passes = int(table["tokens"].sum()), self.forward_passes()
        per_exec = steps.groupby("execution")["batch"].first() if len(steps) else pd.Series(dtype=float)
        return {"model": self.model, "requests": len(table), "tokens": tokens, "wall_s": self.wall_s,
                "tokens_per_s": tokens / self.wall_s if self.wall_s > 0 else float("nan"),
                "ttft_p50_ms": float(np.percentile(table["ttft_ms"], 50)),
                "ttft_p90_ms": float(np.percentile(table["ttft_ms"], 90)),
                "latency_p90_ms": float(np.percentile(table["latency_ms"], 90)),
                "executions": int(len(per_exec)), "mean_batch": float(per_exec.mean()) if len(per_exec) else 0.0,
                "forward_passes": passes, "tokens_per_pass": tokens / passes if passes else float("nan"),
                "complete": self.complete}

    def shared_executions(self, a: str, b: str) -> set[int]:
        """Executions in which a step of request ``a`` and a step of request ``b`` ran together."""
        return set(self[a].executions) & set(self[b].executions)


def closed_loop(streams: int = 8, rounds: int = 4, lengths: Sequence[int] = LENGTHS) -> list[list[Ask]]:
    """``streams`` clients, each sending ``rounds`` requests one after another, lengths mixed.

    Stream ``i`` asks for ``lengths[(i + 3 * r) % len(lengths)]`` tokens in round ``r``: every
    round (with 8 streams and 8 lengths) holds each length once, and each stream meets long and
    short requests in turn, so a static batch always holds a short request stuck behind a long one.
    """
    return [[Ask(f"s{i}r{r}", int(lengths[(i + 3 * r) % len(lengths)])) for r in range(rounds)]
            for i in range(streams)]


class _Collector:
    """Shared by the streams of one run: the generations, and who has received how many tokens."""

    def __init__(self, asks: Sequence[Ask]) -> None:
        self.by_name = {a.name: Generation(a) for a in asks}
        self.cond = threading.Condition()
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def on_response(self, open_request: Generation | None, result, error) -> None:
        """A stream's callback: ``open_request`` is that stream's request in flight (an error names none)."""
        at = self.now()
        with self.cond:
            if error is not None:
                if open_request is not None and not open_request.finals:
                    open_request.error, open_request.final_s = str(error), at
                    open_request.finals += 1
            else:
                response = result.get_response()
                g = self.by_name.get(response.id)
                if g is not None:
                    if g.finals:
                        g.late += 1
                    if response.outputs:
                        out = {o.name: result.as_numpy(o.name).reshape(-1)[0] for o in response.outputs}
                        g.tokens.append(Token(g.ask.name, int(out["STEP"]), out["TEXT"].decode(),
                                              int(out["EXEC"]), int(out["BATCH"]), at, int(out.get("NULLS", 0))))
                    if response.parameters["triton_final_response"].bool_param:
                        g.finals += 1
                        g.final_s = at if np.isnan(g.final_s) else g.final_s
            self.cond.notify_all()

    def wait(self, predicate, timeout_s: float, what: str) -> None:
        with self.cond:
            if not self.cond.wait_for(predicate, timeout=timeout_s):
                raise TimeoutError(what)


def _drive(collector: _Collector, server: RunningServer, model: str, stream: Sequence[Ask], timeout_s: float) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    current: list[Generation | None] = [None]
    client.start_stream(callback=lambda result, error: collector.on_response(current[0], result, error))
    try:
        for ask in stream:
            g = collector.by_name[ask.name]
            current[0] = g
            try:
                for name, count in ask.waits_for():
                    other = collector.by_name[name]
                    collector.wait(lambda: len(other.tokens) >= count or other.finals > 0, timeout_s,
                                   f"{name} received no {count} tokens within {timeout_s:g} s")
                inputs = {"PROMPT": np.array([[ask.prompt.encode()]], dtype=object),
                          "MAX_TOKENS": np.array([[ask.max_tokens]], dtype=np.int32)}
                with collector.cond:
                    g.sent_s = collector.now()
                client.async_stream_infer(model, make_inputs(inputs), request_id=ask.name,
                                          enable_empty_final_response=True)
                if ask.cancel_after:
                    collector.wait(lambda: len(g.tokens) >= ask.cancel_after or g.finals > 0, timeout_s,
                                   f"{ask.name} received no {ask.cancel_after} tokens within {timeout_s:g} s")
                    with collector.cond:
                        g.cancelled_s = collector.now()
                        g.error = g.error or f"cancelled by its client after {len(g.tokens)} tokens"
                    client.stop_stream(cancel_requests=True)  # the stream's later requests are not sent
                    return
                collector.wait(lambda: g.finals > 0, timeout_s,
                               f"no FINAL flag within {timeout_s:g} s ({len(g.tokens)} tokens received)")
            except TimeoutError as exc:
                with collector.cond:
                    g.error = g.error or str(exc)
                return  # the stream may be stuck: its later requests are not sent
        time.sleep(GRACE_S)  # a response after a FINAL would land here, counted as late
    finally:
        client.stop_stream()
        client.close()


def run_streams(server: RunningServer, model: str, streams: Sequence[Sequence[Ask]],
                timeout_s: float = 60.0) -> GenerationRun:
    """Send every stream's requests concurrently (one gRPC stream each); collect every token."""
    collector = _Collector([a for s in streams for a in s])
    threads = [threading.Thread(target=_drive, args=(collector, server, model, s, timeout_s), daemon=True)
               for s in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * (1 + max(len(s) for s in streams)))
    with collector.cond:
        gens = list(collector.by_name.values())
    for g in gens:
        if np.isnan(g.final_s) and not g.error:
            g.error = "not finished (its stream stopped or timed out)"
    ends = [g.final_s for g in gens if not np.isnan(g.final_s)]
    starts = [g.sent_s for g in gens if not np.isnan(g.sent_s)]
    wall_s = max(ends) - min(starts) if ends and starts else float("nan")  # first send to last FINAL
    return GenerationRun(model, gens, wall_s)


def warm_up(server: RunningServer, model: str, timeout_s: float = 30.0) -> GenerationRun:
    """One short request: the first execution pays for imports and allocations a measurement should not."""
    return run_streams(server, model, [[Ask("warm-up", 2)]], timeout_s=timeout_s)
