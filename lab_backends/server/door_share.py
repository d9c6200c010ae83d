"""Each learner's share of the front door: who sent a request, and how much of the door each may hold.

A request is a learner's when its ``lab-learner-token`` is the one ``secure_link_md5`` computes from
its ``lab-learner`` name and the class's secret (:mod:`lab_backends.learner`); anything else counts
as ``-``. In a class the door refuses a ``-`` request (HTTP 401, gRPC ``UNAUTHENTICATED``, with how a
learner's requests carry their token), unless it holds the admin key (the instructor's tools) or only
asks whether the server or a model is ready (``GET /v2/health/*``, ``/v2/models/<m>/ready``, gRPC
``ServerLive``/``ServerReady``/``ModelReady``: the supervisor's and the class tests' checks): a learner
who drops their token no longer gets a second share, the anonymous one, beside their own.

Per learner: at most ``in_flight`` requests at once
(``limit_conn``; HTTP/2 counts each stream, so a gRPC channel's concurrent calls count too); past
that, 429 / ``RESOURCE_EXHAUSTED`` at once. And ``rate`` requests a second: up to ``burst`` requests
over it wait at the door and go on at that pace (``limit_req ... burst``, no ``nodelay``), more are
refused. The access log names the learner of every request.

Why a paced rate and not only a cap on requests in flight: on this 2-core machine the cap alone made
another learner's latency *worse* during a flood (``lab-backends bench door``, docs/scale.md): each
refusal comes back at once and the flooding client sends the next, so the refusals' round trips took
the CPU that the shorter queue freed. A paced request waits in nginx on a timer, and the client thread
waiting for it sleeps: neither takes CPU. The default rate (1000 a second) keeps what lesson 05 checks
on the shared server true: its 8 requests in flight, released 1 ms apart, still meet within the
digits models' 2 ms batching delay (500 a second, 2 ms apart, was the fairer share measured, but
left no margin there).

Who nginx verified goes to the validating gateway in :data:`door_sequences.VERIFIED_HEADER`, set by
nginx on every request it passes on (``proxy_set_header``/``grpc_set_header``: a client's header of that
name is replaced, never passed), so the gateway holds each learner to their own sequence IDs.

Rendered into :mod:`lab_backends.server.door_config`'s ``nginx.conf``: the ``http`` block's lines
(:func:`learners_lines`) and those of every ``location`` that passes requests on
(:func:`location_limits`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from lab_backends import learner
from lab_backends.errors import FrontDoorError
from lab_backends.learner import LEARNER_HEADER, LEARNER_VAR, TOKEN_HEADER, TOKEN_VAR

#: The gateway's header for the learner nginx verified (door_sequences.VERIFIED_HEADER; not imported: that
#: module needs the gateway's dependencies).
VERIFIED_HEADER = "lab-door-learner"
#: Tokenless requests a class's door still answers: readiness checks (GET/HEAD), gRPC's three.
READINESS = r"(GET|HEAD) /v2/(health/(live|ready)|models/[^/]+(/versions/[^/]+)?/ready)$"
GRPC_READINESS = r"/inference\.GRPCInferenceService/(ServerLive|ServerReady|ModelReady)$"


@dataclass(frozen=True)
class FairShare:
    """What each learner may use of the door (module doc): requests in flight, and a rate with a burst."""

    secret: str = field(repr=False)  #: the class's (learner.new_secret): tokens are checked against it
    in_flight: int = 16     #: the largest concurrency a lesson sends (16) passes untouched
    rate_per_s: int = 1000  #: module doc: why this pace
    burst: int = 64         #: requests over the rate that wait (paced) before more are refused

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_\-]{16,}", self.secret):
            raise FrontDoorError("the learners' secret must be 16+ URL-safe characters (lab_backends.learner."
                                 "new_secret makes one): check the file given to --learner-secret-file")
        if min(self.in_flight, self.rate_per_s) < 1 or self.burst < 0:
            raise FrontDoorError(f"a learner's share needs in_flight >= 1, rate >= 1/s and burst >= 0, not {self}")



def add_share_arguments(serve: argparse.ArgumentParser) -> None:
    """``serve``'s options for the learners' shares (their defaults are :class:`FairShare`'s)."""
    serve.add_argument("--learner-secret-file", type=Path, metavar="F",
                       help="with --front-door: tell learners apart by the token made from the secret in F (mode "
                       "0600; `class start` writes it) and give each a share of the door, named in its log")
    serve.add_argument("--learner-in-flight", type=int, default=FairShare.in_flight, metavar="N",
                       help="a learner's requests in flight at the door (default %(default)s); more get 429")
    serve.add_argument("--learner-rate", type=int, default=FairShare.rate_per_s, metavar="R",
                       help="a learner's requests a second (default %(default)s)")
    serve.add_argument("--learner-burst", type=int, default=FairShare.burst, metavar="B",
                       help="requests over the rate that wait at the door, paced to it, before more get 429 "
                       "(default %(default)s)")


def share_limits(args: argparse.Namespace) -> dict[str, int]:
    """:func:`add_share_arguments`' values as :class:`FairShare`'s keyword arguments (all but the secret)."""
    return {"in_flight": args.learner_in_flight, "rate_per_s": args.learner_rate, "burst": args.learner_burst}


def learners_lines(share: FairShare | None) -> list[str]:
    """``$door_learner`` (who a request is: its verified name, else ``-``) and, for a class, its limits."""
    if share is None:
        return ['map "" $door_learner { default "-"; }']
    header = "$http_" + LEARNER_HEADER.replace("-", "_")
    return [
        # $secure_link is "1" when lab-learner-token is base64url(MD5("<lab-learner> <secret>")), else empty.
        "secure_link $http_" + TOKEN_HEADER.replace("-", "_") + ";",
        f'secure_link_md5 "{header} {share.secret}";',
        f'map "$secure_link:{header}" $door_learner {{',
        '    default "-";',
        f'    "~^1:(?<learner>{learner.NAME.pattern})$" $learner;',
        "}",
        "limit_conn_zone $door_learner zone=door_in_flight:1m;",
        f"limit_req_zone $door_learner zone=door_rate:1m rate={share.rate_per_s}r/s;",
        "limit_conn_status 429;",
        "limit_req_status 429;",
        "limit_conn_log_level warn;",
        "limit_req_log_level warn;",
        # Module doc: a request of nobody's, without the admin key and not a readiness check, is refused.
        'map "$door_learner:$door_http_key_ok:$request_method $uri" $door_http_anonymous {',
        "    default 0;",
        f'    "~^-:0:{READINESS}" 0;',
        '    "~^-:0:" 1;',
        "}",
        'map "$door_learner:$door_grpc_key_ok:$uri" $door_grpc_anonymous {',
        "    default 0;",
        f'    "~^-:0:{GRPC_READINESS}" 0;',
        '    "~^-:0:" 1;',
        "}",
    ]


def location_limits(share: FairShare | None, grpc: bool = False) -> list[str]:
    """The lines of a ``location`` that passes requests on: who nginx verified, for the gateway (the client's
    header of that name replaced); in a class, the refusal of tokenless requests and each learner's share."""
    verified = [f"        proxy_set_header {VERIFIED_HEADER} $door_learner;",
                f"        grpc_set_header {VERIFIED_HEADER} $door_learner;"]
    if share is None:
        return verified
    grpc_refusal = ["        if ($door_grpc_anonymous) { add_header grpc-status 16 always; "
                    f'add_header grpc-message "{NO_TOKEN}" always; return 200; }}']
    http_refusal = [f"""        if ($door_http_anonymous) {{ return 401 '{{"error":"{NO_TOKEN}"}}'; }}"""]
    refuse = grpc_refusal if grpc else http_refusal
    return [*verified, *refuse,
            f"        limit_conn door_in_flight {share.in_flight};",
            f"        limit_req zone=door_rate burst={share.burst};" if share.burst else
            "        limit_req zone=door_rate;"]


#: The refusal of a request without a learner's token, in a class (module doc).
NO_TOKEN = (f"the front door of this class refuses requests without a learner token: your JupyterLab sends yours "
            f"(its {LEARNER_VAR} and {TOKEN_VAR}, added to every tritonclient call and rest.request); elsewhere "
            f"send them as headers {LEARNER_HEADER} and {TOKEN_HEADER}, or the admin key")


def too_many(share: FairShare) -> str:
    """The refusal's message (``$door_learner`` is filled in by nginx)."""
    return (f"the front door limits each learner to {share.in_flight} requests in flight and {share.rate_per_s} a "
            "second (learner $door_learner is over it): wait for answers before sending more")
