"""Notebook 08b: what a release does to a sequence slot, and what the statistics count, for an iterative model.

* :func:`cancel_frees_slot`: every sequence slot busy, one more request waiting for a slot; one
  generation is cancelled by its client. The models hand a cancelled request back with RESCHEDULE,
  so the scheduler finds it cancelled at the head of its slot and frees the slot at once (core
  ``sequence_batch_scheduler.cc`` L1644-1656 at r24.10); released with ALL instead, a cancelled
  request ends nothing (``sequence_utils.cc`` L40-56 skips a cancelled one) and its slot waits for
  the idle reaper (``max_sequence_idle_microseconds``). Evidence from the records: the waiting
  request's first token comes from an execution in which every other slot's sequence still ran.
* :func:`iterative_statistics`: what the server's statistics count for one generation of N tokens
  on an iterative model: N successes (the backend reports the request at every step, and core
  counts each report: ``infer_request.cc`` L1445-1449, ``infer_stats.cc`` L104-L116), each with a
  request duration measured from the request's ORIGINAL start (a rescheduled request keeps its
  ``request_start_ns``: it is captured once, ``server.cc`` L545), so their sum grows as N²; and one
  failure: the sequencer's own END marker, a cancelled null request (``sequence_utils.cc`` L44-50),
  answered CANCELLED when the batcher frees the slot (``sequence_batch_scheduler.cc`` L84-97), and
  counted although null requests collect no statistics otherwise (``infer_request.cc`` L1410-1421).
"""

from __future__ import annotations

from dataclasses import dataclass

from lab_backends.measure.generation import Ask, GenerationRun, run_streams
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll, settled


@dataclass
class Cancellation:
    """A generation cancelled while every slot was busy, and when the request waiting for a slot got one."""

    model: str
    run: GenerationRun
    held: list[str]  # the other slots' sequences, still generating
    victim: str  # the one its client cancelled
    waiting: str  # sent once every slot was busy: it waits (the scheduler's backlog) for a free slot

    @property
    def cancel_to_first_token_s(self) -> float:
        """Seconds from the client's cancel to the waiting request's first token (NaN: none came)."""
        waiting = self.run[self.waiting]
        return waiting.tokens[0].t_s - self.run[self.victim].cancelled_s if waiting.tokens else float("nan")

    @property
    def admitted_while_held(self) -> bool:
        """The waiting request's first step ran in an execution in which every held sequence still ran:
        it took the cancelled one's slot, not the slot of a sequence that finished."""
        waiting = self.run[self.waiting]
        if not waiting.tokens:
            return False
        return all(max(self.run[h].executions, default=-1) > waiting.tokens[0].execution for h in self.held)

    def summary(self) -> str:
        victim, waiting = self.run[self.victim], self.run[self.waiting]
        first = waiting.tokens[0].execution if waiting.tokens else None
        ends = sorted(max(self.run[h].executions, default=-1) for h in self.held)
        return (f"{self.model}: '{self.victim}' cancelled after {len(victim.tokens)} tokens; '{self.waiting}' "
                f"got its first token {self.cancel_to_first_token_s * 1000:.0f} ms later, in execution {first}; "
                f"the {len(self.held)} other sequences ran until executions {ends[0]}-{ends[-1]}")


def cancel_frees_slot(server: RunningServer, model: str, slots: int = 8, held_tokens: int = 100,
                      cancel_after: int = 3, timeout_s: float = 60.0, tag: str = "") -> Cancellation:
    """Fill all ``slots`` (the model's max_batch_size with ``direct``), queue one more request, cancel one.

    The waiting request is sent once every slot's sequence has a token (all slots taken); the victim
    is cancelled by its client once it has ``cancel_after`` tokens. ``held_tokens`` sets how long the
    others keep their slots: the room the waiting request has to show it took the freed one.
    """
    if not 1 <= cancel_after < held_tokens // 2:
        raise ValueError("cancel the victim early: the others must keep generating long after it")
    names = [f"{name}-{tag}" if tag else name for name in ("victim", "waiting")]
    victim, waiting = names
    held = [f"held{i}-{tag}" if tag else f"held{i}" for i in range(1, slots)]
    streams = [[Ask(victim, held_tokens, cancel_after=cancel_after)]] + [[Ask(h, held_tokens)] for h in held]
    streams.append([Ask(waiting, 4, after=tuple((name, 1) for name in [victim, *held]))])
    run = run_streams(server, model, streams, timeout_s=timeout_s)
    return Cancellation(model, run, held, victim, waiting)


@dataclass(frozen=True)
class StepStatistics:
    """What the server's statistics counted for ONE generation of ``tokens`` tokens, run alone."""

    model: str
    tokens: int
    latency_s: float  # the client's: sent to FINAL
    successes: int
    failures: int
    inference_count: int
    executions: int
    request_s: float  # the sum of the successes' request durations
    compute_infer_s: float  # the sum of their compute_infer durations
    step_floor_s: float  # the least a step lasts with one sequence: step_ms + per_sequence_ms (paced)

    @property
    def request_floor_s(self) -> float:
        """The least the request durations can sum to: step k ends at least k steps after the start."""
        return self.step_floor_s * self.tokens * (self.tokens + 1) / 2

    def summary(self) -> str:
        return (f"{self.model}: one request of {self.tokens} tokens, {self.latency_s * 1000:.0f} ms at the client; "
                f"the statistics counted {self.successes} successes, {self.failures} failure(s), inference_count "
                f"+{self.inference_count}, {self.executions} executions; request durations sum to "
                f"{self.request_s * 1000:.0f} ms ({self.request_s / self.latency_s:.1f}x the latency; the steps alone "
                f"force >= {self.request_floor_s * 1000:.0f} ms), compute_infer to "
                f"{self.compute_infer_s * 1000:.0f} ms")


def _counts(server: RunningServer, model: str) -> dict[str, float]:
    entry = server.statistics(model)["model_stats"][0]
    inference = entry["inference_stats"]
    return {"success": int(inference["success"]["count"]), "fail": int(inference["fail"]["count"]),
            "request_ns": int(inference["success"]["ns"]), "infer_ns": int(inference["compute_infer"]["ns"]),
            "inference_count": int(entry["inference_count"]), "executions": int(entry["execution_count"])}


def iterative_statistics(server: RunningServer, model: str, tokens: int = 20,
                         timeout_s: float = 30.0) -> StepStatistics:
    """Run one request of ``tokens`` tokens alone; the growth of the model's statistics it caused.

    The statistics are read once they count every step and the END marker (a known total, polled
    with a deadline: the last step's report may land after the client's FINAL).
    """
    parameters = server.model_config(model).parameters
    step_floor_s = sum(float(parameters[k].string_value) for k in ("step_ms", "per_sequence_ms")) / 1000
    before = settled(lambda: _counts(server, model), quiet_s=0.2)  # an earlier generation's END marker lands late
    run = run_streams(server, model, [[Ask("counted", tokens)]], timeout_s=timeout_s)
    after = poll(lambda: _counts(server, model),
                 lambda now: now["success"] - before["success"] >= tokens and now["fail"] > before["fail"],
                 timeout_s, 0.05)
    grew = {k: after[k] - before[k] for k in after}
    return StepStatistics(model, tokens, run["counted"].latency_s, int(grew["success"]), int(grew["fail"]),
                          int(grew["inference_count"]), int(grew["executions"]), grew["request_ns"] / 1e9,
                          grew["infer_ns"] / 1e9, step_floor_s)
