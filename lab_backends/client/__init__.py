"""The client layer: what travels between a learner's code and a running server.

Contract: requests and responses only (KServe v2 over HTTP/REST and gRPC, streams, sequences), built
with ``tritonclient`` or, where the lesson is the bytes themselves, by hand. Given a running server,
never starts or changes one. May import the server layer (for its types and the model repository)
and the shared basics.

Public names: :func:`infer` (one request, either protocol).
"""

from lab_backends.client.infer import infer

__all__ = ["infer"]
