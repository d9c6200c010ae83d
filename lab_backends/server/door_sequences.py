"""Whose sequence a request names, at a class's front door: each learner's correlation IDs are their own.

The sequence batcher keys a sequence by its correlation ID alone, a number or a string (core
``src/sequence_batch_scheduler/sequence_batch_scheduler.h`` L234-L238 at r24.10, looked up at
``sequence_batch_scheduler.cc`` L713): nothing there knows who sent a request, so a learner who names
another's ID adds a value to that sequence, restarts it (START) or ends it (END). The class's helpers
send a learner's IDs in a range of their own (:func:`lab_backends.learner.sequence_id`); the door now
holds every request to it, whoever built it:

- a **number** must be 0 or in the learner's range ``uid * 2**32 + 1 .. uid * 2**32 + 2**32 - 1``
  (``uid`` is the learner's Unix account's, from the system: :func:`owner`). 0 means *no sequence*
  (core ``sequence_utils.h`` L45-L53: the batcher refuses it, an iterative model numbers it itself);
- a **string** must start with ``<learner name>:`` (names have no ``:``, so no prefix is another's);
  ``learner.sequence_id`` adds it, as it maps numbers;
- what Triton reads is what is checked: HTTP's ``parameters.sequence_id`` (server ``src/http_server.cc``
  L2864-L2881: a uint64, else a string; a JSON object with a key twice is refused, as Python's parser
  and Triton's disagree on which one counts), gRPC's ``parameters["sequence_id"]`` (``src/grpc/
  infer_handler.cc`` L214-L231: ``int64_param``, set as the uint64 it wraps to, or ``string_param``).
  Triton reads no other name (``correlation_id`` is only the C API's); ``/generate`` sets none.

Who the learner is comes from nginx (:data:`VERIFIED_HEADER`, set by the door after it checked the
token, replacing any header of that name the client sent: :mod:`lab_backends.server.door_share`);
``-`` (no class, or the instructor's admin key) is not held to a range.
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass
from typing import Any

from lab_backends.learner import NAME, SEQUENCE_SPAN
from lab_backends.server.door_rules import DOOR, Refusal

#: The header nginx sets to the learner it verified (``$door_learner``), to the gateway only.
VERIFIED_HEADER = "lab-door-learner"
#: Correlation IDs are uint64 in Triton (``TRITONSERVER_InferenceRequestSetCorrelationId``).
UINT64 = 1 << 64
HELPERS = "lab_backends' helpers (client.infer, the lessons' sequences) map your IDs into it"


@dataclass(frozen=True)
class Owner:
    """The learner a request is from: their name and Unix UID (``None``: no account here, so no number is theirs)."""

    name: str
    uid: int | None

    def range_text(self) -> str:
        if self.uid is None:
            return f"none: learner {self.name!r} has no account on this machine (ask the instructor)"
        low = self.uid * SEQUENCE_SPAN
        return f"{low + 1}..{low + SEQUENCE_SPAN - 1} (your UID {self.uid} x 2**32 + 1..2**32-1)"


def owner(verified: str | None) -> Owner | None:
    """The learner nginx named (``None``/``-``: nobody to hold to a range), their UID from the system's accounts."""
    if not verified or verified == "-":
        return None
    try:
        return Owner(verified, pwd.getpwnam(verified).pw_uid if NAME.fullmatch(verified) else None)
    except KeyError:
        return Owner(verified, None)


def check_id(who: Owner, corrid: Any) -> Refusal | None:
    """One correlation ID as Triton reads it (an int, wrapped to uint64, or a str) against ``who``'s own."""
    if isinstance(corrid, str):
        if corrid.startswith(f"{who.name}:"):
            return None
        return Refusal(403, f"{DOOR} sequence ID {corrid[:40]!r}: in a class a string ID must start with "
                            f"'{who.name}:' (your name); {HELPERS}")
    if not isinstance(corrid, int) or isinstance(corrid, bool):
        return Refusal(400, f"{DOOR} sequence_id {str(corrid)[:40]}: give an integer or a string")
    value = corrid % UINT64
    if value == 0 or who.uid is not None and value // SEQUENCE_SPAN == who.uid and value % SEQUENCE_SPAN:
        return None
    return Refusal(403, f"{DOOR} sequence ID {corrid}: it is outside your range {who.range_text()}; {HELPERS}")


def check_http_params(who: Owner | None, request: Any) -> Refusal | None:
    """An HTTP infer request's JSON (door_rules.parse_json refused duplicate keys): ``parameters.sequence_id``."""
    if who is None or not isinstance(request, dict) or not isinstance(request.get("parameters"), dict):
        return None
    params = request["parameters"]
    return check_id(who, params["sequence_id"]) if "sequence_id" in params else None


def check_grpc_params(who: Owner | None, request: Any) -> Refusal | None:
    """A ``ModelInferRequest``'s ``parameters["sequence_id"]`` (int64 or string; Triton refuses other kinds)."""
    if who is None or "sequence_id" not in request.parameters:
        return None
    param = request.parameters["sequence_id"]
    kind = param.WhichOneof("parameter_choice")
    if kind == "int64_param":
        return check_id(who, param.int64_param)
    if kind == "string_param":
        return check_id(who, param.string_param)
    return None  # Triton answers "invalid value type for 'sequence_id'" itself (infer_handler.cc L226-L230)

