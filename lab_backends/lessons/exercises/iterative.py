"""Notebook 08b's exercise (``step_and_release``): the step-and-release logic of an iterative decoupled model.

The learner writes ``step(request, seq)``: one step of one request. :mod:`.iterative_model` copies it
into a model of ours (``sequence_batching { iterative_sequence: true }``, decoupled, the ``oldest``
strategy: that module says why, with the r24.10 lines), which this checker serves on a server of its
own (a wrong step must not hurt the learner's) and drives like a client of continuous batching:

1. one long request (:data:`LONG` tokens) on its own gRPC stream; once the model's records show it
   has run two steps, three more (:data:`JOINERS`) at once, each on its own stream. The long one
   still has 22 steps to go, at least :data:`STEP_MS` ms each (1.3 s), while the others need a few
   milliseconds to reach the scheduler (under a second on a starved client): they join a running batch;
2. every stream is read until its final flag, all within one deadline, :data:`STREAM_DEADLINE_S`
   (a backstop: the model itself ends the stream of a request released without a final response,
   or rescheduled past its length; only a step that never returns meets the deadline, and then the
   clients cancel their requests and the server is stopped);
3. the verdict rests on exact facts, none on timing luck: the tokens each client received (the
   generator is deterministic, :func:`~.iterative_model.token_of`), the final flag, and the model's
   records of each execution (which requests ran, the tokens, flags and release flag each step set).

A refusal names the first fault found, in this order: the step raised; a response without TOKEN;
RESCHEDULE after the final response; released with ALL before the last token (one step only); more
than one token in a step; more tokens than asked (every step for every request regardless of its
length); no final flag; a final flag too early; wrong tokens. Then the clients' streams are compared
with the records, and the records must show a request joining the batch while another was generating.
"""

from __future__ import annotations

import ast
import builtins
import concurrent.futures
import inspect
import queue
import symtable
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tritonclient.grpc as grpcclient

from lab_backends.client.infer import make_inputs
from lab_backends.errors import ExerciseError, ModelLoadError
from lab_backends.lessons.exercises.iterative_model import (
    MODEL,
    read_records,
    records_holding,
    steps_of,
    token_of,
    write_model,
)
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

NAME = "step_and_release"
LONG = 24
JOINERS = (5, 1, 3)
STEP_MS = 60.0  # not 10: a GIL-starved client (150 ms slices) got the reference refused in 2 of 3 runs; at 60, 0 of 3
STREAM_DEADLINE_S = 20.0
#: What model.py defines besides the learner's function: the names a step may use (and Python's builtins).
MODEL_GLOBALS = {"pb_utils", "np", "json", "time", "RESCHEDULE", "FINAL", "token_of"}
RESCHEDULE, ALL = 2, 1  # TRITONSERVER_REQUEST_RELEASE_* (core include/triton/core/tritonserver.h L964-967, r24.10)


@dataclass(frozen=True)
class Asked:
    """One request of the scenario: its label in messages, request id, seed and length."""

    label: str
    rid: str
    seed: int
    length: int

    @property
    def expected(self) -> list[int]:
        return [token_of(self.seed, i) for i in range(self.length)]

    def __str__(self) -> str:
        return f"request {self.label} ({self.length} token{'s' * (self.length != 1)})"


@dataclass
class Trail:
    """What the model's records say one request did, step by step, and what its client received."""

    asked: Asked
    steps: list[dict[str, Any]] = field(default_factory=list)
    executions: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    finals: int = 0
    stream_error: str = ""

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.steps for t in s["tokens"]]

    @property
    def final(self) -> bool:
        return any(s["final"] for s in self.steps)


@exercise(
    NAME,
    notebook="08b_continuous_batching",
    task=(
        "Write step(request, seq): ONE step of ONE request of an iterative decoupled model (sequence_batching "
        "{ iterative_sequence: true }). The checker's model calls it once per request in every execute(). "
        f"seq.length: the tokens the request asks for (1 to {LONG}); seq.sent: how many it has been sent so far "
        "(the model counts them); seq.next_token(): the token to emit now. Send it through "
        "request.get_response_sender() as pb_utils.InferenceResponse([pb_utils.Tensor(\"TOKEN\", "
        "np.array([token], dtype=np.int32))]), with flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL on the "
        "request's last token; after every other step call request.set_release_flags("
        "pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE), so that the scheduler runs the request again at the "
        "next step, and leave the last step released with the default (ALL). Your function is copied into the "
        "model's model.py, where pb_utils and np are imported: it can use nothing else from your notebook. The "
        f"checker serves it on a server of its own and streams requests of {LONG}, "
        f"{', '.join(str(n) for n in JOINERS)} tokens over gRPC, the last three started while the first one is "
        "generating; every stream must get exactly its tokens, in order, then one final flag."
    ),
    models=(),
)
def _check_step_and_release(answer: Callable[[Any, Any], None] | None, server: RunningServer | None) -> str:
    """Serve the learner's step in our model on our own server; judge the streams and the model's records."""
    if answer is None:
        raise NotImplementedError
    source, name = learner_step(answer)
    rng = np.random.default_rng()
    tag = int(rng.integers(1, 1 << 30))
    asked = [Asked(label, f"{NAME}-{tag}-{label}", int(rng.integers(1, 1 << 20)), length)
             for label, length in zip("ABCD", (LONG, *JOINERS))]
    with tempfile.TemporaryDirectory(prefix="exercise-iterative-") as tmp:
        records = Path(tmp) / "records.jsonl"
        records.touch()
        write_model(Path(tmp) / "models", source, name, records, STEP_MS)
        try:
            own = TritonServer(model_repository=[Path(tmp) / "models"], models=[MODEL], target="local").start()
        except ModelLoadError as exc:
            raise ExerciseError(f"the server could not load the model built around your step: {exc}") from exc
        try:
            trails = drive(own, asked, records)
        finally:
            own.stop()
    return judge(trails)


def learner_step(answer: Any) -> tuple[str, str]:
    """(source of the learner's function as model.py will hold it, its name); NotImplementedError for the skeleton."""
    if not callable(answer):
        raise ExerciseError(f"the answer is a function step(request, seq), not {type(answer).__name__}")
    try:
        source = textwrap.dedent(inspect.getsource(answer))
    except (OSError, TypeError):
        # No source: a cell run by exec (the audit's copy of the notebook's answer cell). Only the
        # skeleton is handed over that way; a notebook keeps every cell's source.
        _raises_not_implemented(answer)
        raise ExerciseError("the checker could not read the source of your function: define step with `def` in "
                            "a notebook cell (or a .py file) and pass it") from None
    name = getattr(answer, "__name__", "")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise ExerciseError("write step as a `def` function of its own (not a lambda, a method or a nested "
                            "function): the checker copies it into the model's model.py")
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0]):
        raise NotImplementedError("step still only raises NotImplementedError: write its body, then run this "
                                  "cell again")
    if len(node.args.args) + len(node.args.posonlyargs) < 2 and node.args.vararg is None:
        raise ExerciseError(f"{name} must take two arguments, (request, seq): the model calls {name}(request, seq)")
    node.decorator_list = []
    source = ast.unparse(node)
    missing = sorted(_globals_used(source) - MODEL_GLOBALS - set(dir(builtins)) - {name})
    if missing:
        raise ExerciseError(
            f"your function {name} uses {', '.join(missing)}, which the model does not have: only the function is "
            f"copied into model.py (with pb_utils and np imported), so define what it needs inside {name}")
    return source, name


def _raises_not_implemented(answer: Callable[..., Any]) -> None:
    try:
        answer(None, None)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - any other failure outside the model says nothing: the source is missing
        pass


def _globals_used(source: str) -> set[str]:
    """The global names the functions of ``source`` read (free names resolved in model.py)."""
    found: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        if table.get_type() != "module":
            found.update(s.get_name() for s in table.get_symbols() if s.is_referenced() and s.is_global())
        for child in table.get_children():
            walk(child)

    walk(symtable.symtable(source, "<step>", "exec"))
    return found


def _stream(server: RunningServer, asked: Asked, deadline: float) -> tuple[list[int], int, str]:
    """(tokens the client received, final flags seen, error) for one request on a gRPC stream of its own.

    Past ``deadline`` the client cancels its request: ``stop_stream()`` without ``cancel_requests``
    would block until the server ends the request, which a step stuck in a loop never lets it do.
    """
    events: queue.Queue = queue.Queue()
    inputs = {"SEED": np.array([[asked.seed]], np.int32), "LENGTH": np.array([[asked.length]], np.int32)}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    tokens: list[int] = []
    ended = False
    try:
        client.async_stream_infer(MODEL, make_inputs(inputs), request_id=asked.rid, enable_empty_final_response=True)
        while not ended:
            try:
                result, error = events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return tokens, 0, f"its stream got no final flag within {STREAM_DEADLINE_S:.0f} s"
            if error is not None:
                return tokens, 0, f"its stream ended with an error: {error}"
            response = result.get_response()
            if any(o.name == "TOKEN" for o in response.outputs):
                tokens.append(int(result.as_numpy("TOKEN").reshape(-1)[0]))
            ended = response.parameters["triton_final_response"].bool_param
        return tokens, 1, ""
    finally:
        client.stop_stream(cancel_requests=not ended)
        client.close()


def drive(server: RunningServer, asked: list[Asked], records: Path) -> list[Trail]:
    """The long request first; the others once it has run two steps; every stream to its end; the trails."""
    deadline = time.monotonic() + STREAM_DEADLINE_S  # one for all: a stuck step costs this once
    with concurrent.futures.ThreadPoolExecutor(len(asked)) as pool:
        futures = [pool.submit(_stream, server, asked[0], deadline)]
        while (steps_of(read_records(records), asked[0].rid) < 2 and not futures[0].done()
               and time.monotonic() < deadline):
            time.sleep(0.005)
        futures += [pool.submit(_stream, server, a, max(deadline, time.monotonic() + 5.0)) for a in asked[1:]]
        received = [f.result() for f in futures]
    trails = [Trail(a, received=r[0], finals=r[1], stream_error=r[2]) for a, r in zip(asked, received)]
    by_id = {t.asked.rid: t for t in trails}
    received = {t.asked.rid: (len(t.received), bool(t.finals)) for t in trails}
    for row in records_holding(records, received):
        for entry in row["requests"]:
            if entry.get("id") in by_id:
                by_id[entry["id"]].steps.append(entry)
                by_id[entry["id"]].executions.append(row["execution"])
    return trails


def _flag(release: int | None) -> str:
    if release is None:
        return "no release flag set, so TRITONSERVER_REQUEST_RELEASE_ALL (the default)"
    return "TRITONSERVER_REQUEST_RELEASE_ALL" if release == ALL else f"release flags {release}"


def faults(t: Trail) -> list[tuple[int, str]]:
    """(rank, message) of every fault the records show for one request: the lowest rank is reported first."""
    a, found = t.asked, []
    tokens, closed = t.tokens, [(i + 1, s) for i, s in enumerate(t.steps) if s["closed"]]
    for k, s in enumerate(t.steps, 1):
        if s["error"]:
            found.append((0, f"your step raised {s['error']} at step {k} of {a} (it runs inside the model.py the "
                             "checker writes, with pb_utils and np imported)"))
        if s["without_token"] or s["error_responses"]:
            found.append((1, f"{a} got a response without a TOKEN output at step {k} (outputs "
                             f"{s['without_token'][:1] or 'an error'}): send pb_utils.Tensor(\"TOKEN\", "
                             "np.array([token], dtype=np.int32))"))
        if not (s["tokens"] or s["final"] or s["without_token"] or s["error_responses"] or s["error"]):
            found.append((1, f"your step sent nothing at step {k} of {a}: every step sends one token through "
                             "request.get_response_sender().send(...) (a decoupled model returns no responses)"))
        if len(s["tokens"]) > 1:
            found.append((4, f"{a} got {len(s['tokens'])} tokens in one step (step {k}): one step is one token for "
                             "each request of the batch, then RESCHEDULE, so that requests join and leave between "
                             "steps; a whole request generated in one execute() is static batching"))
    for k, s in closed:
        if s["closed"] == "rescheduled after its final response":
            found.append((2, f"{a} was released with RESCHEDULE at step {k}, after its final response: rescheduling "
                             "after the final flag would run a finished request again, for a stream its client "
                             "has closed (the checker released it with ALL instead); set RESCHEDULE only on the "
                             "steps that are not the last"))
        elif s["closed"] == "released without its final response" and len(tokens) < a.length:
            found.append((3, f"{a} was released with {_flag(s['release'])} instead of RESCHEDULE after step {k}, "
                             f"with {len(tokens)} token(s) sent and no final flag: ALL ends the request for good, "
                             "the scheduler never runs it again (one step only) and its stream waits forever; call "
                             "request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) on "
                             "every step but the last"))
    if len(tokens) > a.length:
        stopped = " before the checker stopped it" if any(s["closed"] for s in t.steps) else ""
        found.append((5, f"{a} got {len(tokens)} tokens{stopped}: your step generates every step for every request "
                         "regardless of its length; stop at seq.length (seq.sent counts what was sent)"
                         + ("" if t.final else ", and send the final flag with the last token")))
    if not t.final and len(tokens) >= a.length:
        found.append((6, f"{a} got its {a.length} token(s) but never the final flag, so the checker ended its "
                         "stream itself (a client would wait forever): send the last token with "
                         "flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL (or an empty final response)"))
    if not t.final and len(tokens) < a.length and any(s["closed"] == "still rescheduled past its length"
                                                       for s in t.steps):
        found.append((6, f"{a} was still rescheduled after {len(t.steps)} steps with {len(tokens)} token(s) sent and "
                         "never the final flag, so the checker stopped it: send seq.next_token() at each step and "
                         "flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL with the last one"))
    if t.final and len(tokens) < a.length:
        found.append((7, f"{a} got the final flag after {len(tokens)} token(s): send FINAL with (or after) the last "
                         "token, not before"))
    wrong = next((i for i, (g, w) in enumerate(zip(tokens, a.expected)) if g != w), None)
    if wrong is not None:
        found.append((8, f"{a}: token {wrong} is {tokens[wrong]}, expected {a.expected[wrong]}: emit "
                         "seq.next_token() at each step (it moves on as the model counts what was sent)"))
    found += [(9, f"{a}: {s['closed']} at step {k} (the checker ended its stream)") for k, s in closed]
    if not t.steps:
        found.append((9, f"{a}: no execution that held it came to an end ({t.stream_error or 'no record of it'}): "
                         "does your step return? It runs one step, then the model hands over the next"))
    return found


def judge(trails: list[Trail]) -> str:
    """The first fault (by rank, then request) as an ExerciseError, or what the run showed."""
    found = sorted((rank, i, message) for i, t in enumerate(trails) for rank, message in faults(t))
    if found:
        raise ExerciseError(found[0][2])
    for t in trails:
        if t.stream_error:
            raise ExerciseError(f"{t.asked}: {t.stream_error}")
        if t.received != t.tokens or t.finals != 1:
            raise ExerciseError(f"{t.asked}: its client received {t.received} and {t.finals} final flag(s), while "
                                f"the model sent {t.tokens} and one final flag")
    long, joiners = trails[0], trails[1:]
    first_join = min(t.executions[0] for t in joiners)
    if not long.executions[0] < first_join <= long.executions[-1]:
        raise ExerciseError(
            f"no request joined while another was generating: {long.asked} ran in executions "
            f"{long.executions[0]}-{long.executions[-1]}, the others started at execution {first_join}; one token "
            "per step and RESCHEDULE let new requests in between steps")
    sizes = {e: sum(e in t.executions for t in trails) for t in trails for e in t.executions}
    step_then = long.executions.index(min(e for e in long.executions if e >= first_join)) + 1
    return (f"{len(trails)} requests ({', '.join(str(t.asked.length) for t in trails)} tokens) each got exactly its "
            f"tokens, in order, then one final flag, in {len(sizes)} executions of {min(sizes.values())} to "
            f"{max(sizes.values())} requests; the first newcomer joined at execution {first_join}, while request "
            f"{long.asked.label} was at step {step_then} of {LONG}: the batch changed between steps.")
