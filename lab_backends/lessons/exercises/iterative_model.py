"""The model the ``step_and_release`` checker serves (:mod:`.iterative`): the learner's step inside code of ours.

The learner writes ``step(request, seq)``, one step of ONE request: emit its next token, send the
final flag on the last one, set the release flag. :func:`write_model` copies that function into a
``model.py`` whose ``execute`` (the checker's, not the learner's) does the rest of an iterative
decoupled model:

* keeps each request's :class:`Sequence` across executions, keyed by the client's request id (a
  rescheduled request is the same request object again, with the same id and inputs:
  ``IterativeSequencer::RescheduleRequest`` re-enqueues it with its flags cleared, core
  ``src/sequence_batch_scheduler/sequence_utils.cc`` L31-39 at r24.10);
* hands the learner's step stand-ins for the request and its response sender, which pass every call
  on to the real ones and note what happened (tokens sent, final flag, release flag asked for);
* writes one JSON line per execution to a records file: which requests ran, and what each did.
  The checker judges those records, and the streams its clients received;
* enforces what a wrong answer must not be allowed to do, so that no answer can hang the checker or
  harm the server. A request may be rescheduled only while it has no final response and has run at
  most ``length`` steps (``length + 1`` steps allow a final flag sent alone, one step after the last
  token); otherwise it is released with ALL, and a request left without its final response gets one
  (an empty FINAL) from the model, so that its client stream ends at once. Never rescheduling a
  finished request matters: the Python backend makes a new response factory for the request at each
  execution (python_backend ``src/python_be.cc`` L311 at r24.10), so a rescheduled finished request
  could send responses to a stream its client already closed.

The config uses the ``oldest`` strategy, not ``direct`` (the default): with ``direct``, the batcher
fills every free slot below the highest busy one with a *null request* (core
``src/sequence_batch_scheduler/sequence_batch_scheduler.cc`` L1734-1767 at r24.10: ``CopyAsNull``
with the not-ready control set), a copy with an empty request id and uninitialised inputs
(``src/infer_request.cc`` L509-517). Measured on the embedded 2.51, they reach ``execute`` with an
empty ``request_id()`` and inputs such as -86147072: a step that does not recognise them computes on
garbage. Telling them apart is taught by the lesson itself (``generate_iterative`` declares a READY
control input and skips them), not by this exercise, whose step is about one request's token, final
flag and release; ``oldest`` hands its dynamic batcher only real requests
(``sequence_batch_scheduler.cc`` L1993-2038: a cancelled one, such as the null request
``RescheduleRequest`` enqueues to free a finished sequence's slot, ``sequence_utils.cc`` L43-55, ends
the slot and never reaches the model). The model still skips a request with an empty id, in code of
ours, should one come.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from lab_backends.lessons import authoring
from lab_backends.waiting import poll

MODEL = "iterative_exercise"
#: Sequence slots = the largest batch: every request of the checker's scenario runs in one instance at once.
SLOTS = 4


def token_of(seed: int, i: int) -> int:
    """Token ``i`` of the request with ``seed``: the generator, deterministic so that tokens can be checked exactly."""
    return (seed * 7919 + (i + 1) * 104729) % 50257


TEMPLATE = '''"""iterative_exercise: written by the step_and_release checker around the learner's step (below).

One execute() = one step of every request the scheduler handed it; the rest of this file is the
checker's (lab_backends/lessons/exercises/iterative_model.py says why each part is there).
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

@@TOKEN_OF@@

# ---------------------------------------------------------------- the learner's step, as written
@@STEP@@
# ----------------------------------------------------------------

LEARNER_STEP = @@NAME@@


class Sequence:
    """What step() knows of its request: length (tokens asked), sent (tokens sent so far), next_token()."""

    def __init__(self, seed, length):
        self.seed, self.length, self.sent, self.steps, self.final = seed, length, 0, 0, False

    def next_token(self):
        return token_of(self.seed, self.sent)


class _Sender:
    """The learner's response sender: passes each send on, and notes tokens and the final flag."""

    def __init__(self, real, seq, entry):
        self._real, self._seq, self._entry = real, seq, entry

    def send(self, response=None, flags=0):
        token = names = None
        if response is not None and not response.has_error():
            names = [t.name() for t in response.output_tensors()]
            tensor = pb_utils.get_output_tensor_by_name(response, "TOKEN")
            values = np.asarray(tensor.as_numpy()).reshape(-1) if tensor is not None else []
            token = int(values[0]) if len(values) else None
        self._real.send(response, flags=flags)  # first: a send Triton refuses is not counted
        if response is not None and response.has_error():
            self._entry["error_responses"] += 1
        elif token is not None:
            self._entry["tokens"].append(token)
            self._seq.sent += 1
        elif response is not None:
            self._entry["without_token"].append(names)
        if flags & FINAL:
            self._entry["final"] = True
            self._seq.final = True

    def is_cancelled(self):
        return self._real.is_cancelled()


class _Request:
    """The learner's request: set_release_flags is noted (the model applies it), the rest is the real one's."""

    def __init__(self, real, sender):
        self._real, self._sender, self.release = real, sender, None

    def get_response_sender(self):
        return self._sender

    def set_release_flags(self, flags):
        self.release = int(flags)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _scalar(request, name):
    return int(np.asarray(pb_utils.get_input_tensor_by_name(request, name).as_numpy()).reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.records = params["records"]["string_value"]
        self.step_s = float(params["step_ms"]["string_value"]) / 1000.0
        self.seqs = {}
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        time.sleep(self.step_s * (1.0 + 0.25 * len(requests)))  # one forward pass over the whole batch
        entries = [self._one(request) for request in requests]
        with open(self.records, "a") as out:
            out.write(json.dumps({"execution": self.executions, "t": time.monotonic(), "requests": entries}) + "\\n")
        return None  # decoupled: everything went through the senders

    def _one(self, request):
        rid = request.request_id()
        if not rid:  # a null request (the direct strategy only): not the learner's business
            return {"id": "", "null": True}
        seq = self.seqs.get(rid)
        if seq is None:
            seq = self.seqs[rid] = Sequence(_scalar(request, "SEED"), _scalar(request, "LENGTH"))
        seq.steps += 1
        entry = {"id": rid, "step": seq.steps, "sent_before": seq.sent, "tokens": [], "final": False,
                 "release": None, "error": "", "error_responses": 0, "without_token": [], "closed": ""}
        sender = request.get_response_sender()
        if seq.final:  # never happens: a finished request is never rescheduled (below)
            entry["closed"] = "ran again after its final response"
            return entry
        stand_in = _Request(request, _Sender(sender, seq, entry))
        try:
            LEARNER_STEP(stand_in, seq)
        except Exception as exc:  # the learner's code failed: the records say how
            entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["release"] = stand_in.release
        wants = stand_in.release == RESCHEDULE
        if wants and not seq.final and not entry["error"] and seq.steps <= seq.length:
            request.set_release_flags(RESCHEDULE)
            return entry
        if wants:
            entry["closed"] = ("rescheduled after its final response" if seq.final else
                               "step raised" if entry["error"] else "still rescheduled past its length")
        if not seq.final:  # released (ALL) without a final response: end its client stream now
            sender.send(flags=FINAL)
            seq.final = True
            entry["closed"] = entry["closed"] or "released without its final response"
        return entry
'''


def model_source(step_source: str, step_name: str) -> str:
    """``model.py``: the template with the generator and the learner's function (named ``step_name``) in it."""
    return (TEMPLATE.replace("@@TOKEN_OF@@", inspect.getsource(token_of))
            .replace("@@STEP@@", step_source).replace("@@NAME@@", step_name))


def write_model(repository: Path, step_source: str, step_name: str, records: Path, step_ms: float) -> Path:
    """``<repository>/iterative_exercise``: decoupled, iterative sequence batching (``oldest``), one instance."""
    config = authoring.python_config(
        MODEL,
        [authoring.Tensor("SEED", "INT32", [1]), authoring.Tensor("LENGTH", "INT32", [1])],
        [authoring.Tensor("TOKEN", "INT32", [1])],
        max_batch_size=SLOTS, parameters={"records": records, "step_ms": step_ms},
    )
    config.model_transaction_policy.decoupled = True
    config.sequence_batching.iterative_sequence = True
    config.sequence_batching.max_sequence_idle_microseconds = 30_000_000
    config.sequence_batching.oldest.max_candidate_sequences = SLOTS
    return authoring.write_model(repository, model_source(step_source, step_name), config)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The model's records: one dict per execution, in order (a line being written is skipped)."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def steps_of(rows: list[dict[str, Any]], rid: str) -> int:
    """How many steps of request ``rid`` the records hold."""
    return sum(1 for row in rows for entry in row["requests"] if entry.get("id") == rid)


#: How long the model's records may lag what the clients received (bounded; a known total is awaited).
RECORDS_DEADLINE_S = 10.0


def records_holding(path: Path, received: dict[str, tuple[int, bool]],
                    timeout_s: float = RECORDS_DEADLINE_S) -> list[dict[str, Any]]:
    """The records once they hold, for each request id, the tokens its client received (and its final
    flag, if it got one): the model writes an execution's line after that execution's responses went
    out, so a client can hold its last token a moment before the line that records it exists (a fresh
    clone's audit under load judged a correct step by a records file one line short). Past the
    deadline: what is there, and the verdict says what is missing."""
    def complete(rows: list[dict[str, Any]]) -> bool:
        tokens = dict.fromkeys(received, 0)
        finals = dict.fromkeys(received, False)
        for row in rows:
            for entry in row["requests"]:
                if entry.get("id") in tokens:
                    tokens[entry["id"]] += len(entry["tokens"])
                    finals[entry["id"]] |= bool(entry["final"] or entry["closed"])  # a close sends FINAL too
        return all(tokens[rid] >= count and (finals[rid] or not final) for rid, (count, final) in received.items())

    return poll(lambda: read_records(path), complete, timeout_s, 0.01)
