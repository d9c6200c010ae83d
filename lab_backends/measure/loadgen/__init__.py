"""A load generator that is not the bottleneck: closed and open loops over gRPC and HTTP.

Two ways to offer load, because they answer different questions:

* **closed loop** (:func:`run_closed`): N requests always in flight; a new one leaves only when one
  comes back. Throughput follows the server, and queueing stays hidden: when the server slows
  down, the client simply sends less.
* **open loop** (:func:`run_open`): requests arrive at a target rate (Poisson), whether or not the
  server keeps up. Latency is measured from each request's *scheduled* arrival, so when the server
  falls behind, the queue (and the latency) grows without bound, as it would with real users.

Each run has a warm-up, then a measured window bounded by a request count *and* a time limit. The
server's statistics are snapshotted right before and right after the window (with nothing in
flight), so the server-side breakdown (:mod:`lab_backends.measure.stats`) covers exactly the same requests.

Why it is fast enough: a plain ``tritonclient`` aio client spends most of its CPU building
``InferInput`` objects, serializing numpy arrays and wrapping results, per request, on the same two
cores the server needs. Here a request is serialized **once** (protobuf bytes for gRPC, a complete
HTTP/1.1 message with binary tensors for HTTP) and resent as-is: gRPC through a raw ``grpc.aio``
method with no (de)serializers, HTTP through a small keep-alive asyncio protocol. Responses
are checked for status, not decoded.

The package: :mod:`.payloads` (request bytes), :mod:`.senders` and :mod:`.http_client` (how a
request leaves), :mod:`.loops` (closed/open), :mod:`.results`, :mod:`.runners` (:func:`run_closed`,
:func:`run_open` and their shared :class:`LoadOptions`). A new way to send (say, HTTP/2) is a sender
registered in :func:`.senders.make_sender`; a new way to offer load is a loop plus a runner.
"""

from lab_backends.client.infer import PROTOCOLS
from lab_backends.measure.loadgen.loops import Record
from lab_backends.measure.loadgen.payloads import example_inputs, grpc_request_bytes, http_request_bytes
from lab_backends.measure.loadgen.results import LoadResult, summarize
from lab_backends.measure.loadgen.runners import LoadOptions, run_closed, run_open
from lab_backends.measure.loadgen.senders import CLIENTS

__all__ = ["CLIENTS", "PROTOCOLS", "LoadOptions", "LoadResult", "Record", "example_inputs", "grpc_request_bytes",
           "http_request_bytes", "run_closed", "run_open", "summarize"]
