"""Who a request comes from at the front door: a learner's name, and a token only the class can make.

A class's learners share one Triton behind the front door (``server/front_door.py``). To share it
fairly, the door must tell them apart, and every request arrives from 127.0.0.1. So the hub gives
each learner's server two values in its environment: the learner's name (:data:`LEARNER_VAR`) and
a token (:data:`TOKEN_VAR`), ``base64url(MD5(name + " " + secret))``. Every request carries both as
headers (:func:`headers`, :func:`metadata`): ``rest.request`` adds them, the ``with_key`` boot module
adds them to every tritonclient call, and the hand-made clients send them too (``protocol.timed_post``
and ``grpc_exchange``, ``latency``, ``streaming``, the load generator's senders). The door recomputes
the token with nginx's ``secure_link`` module (``secure_link_md5``,
nginx.org/en/docs/http/ngx_http_secure_link_module.html), keeping the class's secret in its root-only
config. A request whose token matches is counted as that learner's. Any other request is counted as
``-``, one shared bucket for everything anonymous.

Why MD5: it is the hash that ``secure_link`` computes, and nginx has no other keyed check short of a
module of our own. The secret is the end of the hashed text, so a learner who knows their own token
and name cannot extend it. Making another learner's token means finding an MD5 preimage under an
unknown 256-bit suffix, which no known attack does. Names are Unix account names (``useradd``'s
rule), so no space or quote can shift the boundary between the name and the secret.

Correlation IDs (issue 38): on a shared server every learner's sequences live in one sequence
batcher, keyed by the correlation ID alone, so two learners who both pick ``sequence_id=7`` (the
lessons suggest small numbers) would add to one running mean. In a class, the correlation ID a
learner passes is therefore sent as ``uid * 2**32 + id`` (:func:`sequence_id`): Unix UIDs are unique
on the machine, so the ranges cannot overlap, and no list of learners is needed. ``client.infer``
applies it, so the lessons' sequence helpers and every answer built on ``infer`` stay in range. A
string ID is sent as ``"<name>:<id>"`` (names hold no ``:``). The door enforces both (issue 46): its
validating gateway reads the ID from the body (JSON ``parameters`` over HTTP, protobuf over gRPC) and
refuses one outside the learner nginx verified (:mod:`lab_backends.server.door_sequences`), so a
hand-made request cannot name another learner's sequence either.

Written by hand (twenty lines): no maintained library produces ``secure_link``'s token format.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
from typing import Mapping

#: The headers a learner's requests carry (HTTP headers; gRPC metadata of the same names).
LEARNER_HEADER = "lab-learner"
TOKEN_HEADER = "lab-learner-token"
#: The environment variables the hub sets for a learner's server (``classroom/spawner.py``).
LEARNER_VAR = "LAB_LEARNER"
TOKEN_VAR = "LAB_LEARNER_TOKEN"
#: A learner's name: ``useradd``'s default NAME_REGEX on Debian, as ``class add-learners`` checks it.
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def new_secret() -> str:
    """A class's secret: 256 random bits, URL-safe (nothing to escape inside nginx's config)."""
    return secrets.token_urlsafe(32)


def token_for(secret: str, name: str) -> str:
    """The token nginx's ``secure_link_md5 "$name $secret"`` expects: unpadded base64url of the MD5."""
    if not NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a learner's name (a Unix account name: lowercase, digits, _ and -)")
    digest = hashlib.md5(f"{name} {secret}".encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def headers(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The learner's two headers from ``environ``, or none when this process is not a learner's."""
    name, token = environ.get(LEARNER_VAR, ""), environ.get(TOKEN_VAR, "")
    return {LEARNER_HEADER: name, TOKEN_HEADER: token} if name and token else {}


#: How many correlation IDs each learner has: 1 .. 2**32 - 1, sent as ``uid * SEQUENCE_SPAN + id``.
SEQUENCE_SPAN = 1 << 32


def sequence_id(corrid: int | str, environ: Mapping[str, str] = os.environ, uid: int | None = None) -> int | str:
    """The correlation ID a request carries: the learner's own range in a class, else ``corrid`` unchanged.

    ``0`` (no sequence) passes unchanged; a string gets the learner's name and ``:`` in front (once); a
    numeric ID outside 1 .. 2**32 - 1 in a class is refused, since it would leave the learner's range.
    """
    if not headers(environ) or corrid == 0:
        return corrid
    if isinstance(corrid, str):
        prefix = environ[LEARNER_VAR] + ":"
        return corrid if corrid.startswith(prefix) else prefix + corrid
    if not 0 < int(corrid) < SEQUENCE_SPAN:
        raise ValueError(f"in a class, a sequence ID must be between 1 and {SEQUENCE_SPAN - 1} (yours is sent in a "
                         f"range of your own on the shared server), got {corrid}")
    return (os.getuid() if uid is None else uid) * SEQUENCE_SPAN + int(corrid)


def metadata(environ: Mapping[str, str] = os.environ) -> tuple[tuple[str, str], ...]:
    """The same as gRPC call metadata (``stub.ModelInfer(request, metadata=...)``); empty outside a class."""
    return tuple(headers(environ).items())
