"""What the front door checks in an inference request before tritonserver sees it: pure, no I/O.

Triton 2.51 dies on requests no client library sends (docs/reliability.md, platform notes "Crashers
that need no size"): 200,000 nested ``[`` (SIGSEGV: common ``include/triton/common/triton_json.h``
L179-180 at r24.10 parses with rapidjson's recursive parser, ``kParseIterativeFlag`` unset), a JSON
shape of ``[1099511627776]`` with one datum (server ``src/http_server.cc`` L2747-2752 sizes a buffer
from the shape, ``serialized.resize(element_cnt * dtype size)``, before ``ReadDataFromJson`` counts the
data: ``std::bad_alloc``, abort), a binary request whose shape's byte size wraps 64 bits (a Python
model's stub dies; the model stays READY and fails every later request). Each rule here closes one of
them by checking what the request *claims* against what it *carries* and what the model's config allows:

- **nesting**: a body's ``[``/``{`` depth is counted without recursion (:func:`nesting_depth`, outside
  JSON strings) before the standard :mod:`json` parser sees it; past :data:`MAX_DEPTH` -> 400.
- **shape against the model's config**: rank, fixed dims and ``max_batch_size`` (what Triton checks
  too, but after it has sized the tensor); every dim a non-negative integer.
- **elements against what was sent**: a JSON input's shape must hold exactly as many values as its
  ``data`` has, a binary one's byte size must equal its ``binary_data_size`` (Python integers do not
  wrap: the comparison is exact), a shared-memory one must fit its region's declared byte size. So a
  shape can never claim more than the body, which nginx already bounds.
- **elements against the model**: at most ``max(1, max_batch_size) x`` its fixed dims, a ``-1`` dim
  counted so that the whole input may hold :data:`VARIABLE_ELEMENTS` (lesson 01's exercise sends
  ``1 << 21`` float32 to ``echo``: the largest legitimate request of the lessons) -> 413 past it.
- **one key once**: an infer request's JSON object naming a key twice -> 400 (Triton reads the first,
  Python the last: the door would check another shape than Triton sizes).
- **gRPC** (:func:`check_grpc`): the same on tritonclient's own ``ModelInferRequest`` protobuf: raw
  contents per input, or typed contents counted per element.

A :class:`Refusal` is one line: what was wrong and the fix. HTTP answers it with its ``status``
(400, 403 or 413), gRPC with :attr:`Refusal.grpc_code` (INVALID_ARGUMENT, PERMISSION_DENIED, RESOURCE_EXHAUSTED).
The gateway (:mod:`lab_backends.server.door_gateway`) applies these rules; a unit test needs no server.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from tritonclient.grpc import model_config_pb2

#: Deepest ``[``/``{`` nesting of a body. A KServe request needs 3 (``{"inputs":[{``) plus one per
#: dim of a nested ``data`` list plus 2 for parameters; Triton 2.51 crashed at 200,000.
MAX_DEPTH = 64
#: Elements an input with a ``-1`` dim may hold: lesson 01's exercise (``LARGE = 1 << 21`` float32 to ``echo``).
VARIABLE_ELEMENTS = 1 << 21
#: The largest rank a request's shape may have (Triton's own tensors rarely pass 8).
MAX_RANK = 32
#: Bytes per element of the fixed-size KServe v2 types (BYTES: its 4-byte length prefix at least).
ITEM_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
              "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8, "BYTES": 4}
#: The typed field of gRPC's ``InferTensorContents`` that carries each datatype.
GRPC_CONTENTS = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                 "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
                 "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
                 "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
DOOR = "the front door refuses"
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


@dataclass(frozen=True)
class Refusal:
    """Why the door refuses a request, in one line that names the fix; ``status`` is HTTP's."""

    status: int
    message: str

    @property
    def grpc_code(self) -> str:
        """The ``grpc.StatusCode`` name: RESOURCE_EXHAUSTED for size, PERMISSION_DENIED for another's, else
        INVALID_ARGUMENT."""
        return {413: "RESOURCE_EXHAUSTED", 403: "PERMISSION_DENIED"}.get(self.status, "INVALID_ARGUMENT")


def _bad(message: str) -> Refusal:
    return Refusal(400, f"{DOOR} {message}")


def _large(message: str) -> Refusal:
    return Refusal(413, f"{DOOR} {message}")


@dataclass(frozen=True)
class InputRule:
    """One input of a model's config: its KServe datatype and dims (``-1``: any)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelRules:
    """What a model's config allows: its inputs and ``max_batch_size`` (0: no batch dim)."""

    name: str
    max_batch_size: int = 0
    inputs: Mapping[str, InputRule] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Any, name: str | None = None) -> "ModelRules":
        """From a ``ModelConfig`` protobuf (:func:`repository.read_config`). A config without inputs
        (Python's ``auto_complete_config`` fills them at load) gets only the rules that need none."""
        inputs = {}
        for tensor in config.input:
            dtype = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
            inputs[tensor.name] = InputRule(tensor.name, "BYTES" if dtype == "STRING" else dtype, tuple(tensor.dims))
        return cls(name or config.name, max(0, config.max_batch_size), inputs)

    def max_elements(self, rule: InputRule) -> int:
        """The most elements this input can hold at ``max_batch_size`` (module doc: a ``-1`` dim)."""
        fixed = max(1, self.max_batch_size)
        for dim in rule.dims:
            fixed *= max(dim, 1)
        return max(fixed, VARIABLE_ELEMENTS) if any(d < 0 for d in rule.dims) else fixed


def nesting_depth(body: bytes) -> int:
    """The deepest ``[``/``{`` nesting of ``body`` outside JSON strings, without recursion.

    Strings are blanked first (a regular expression, linear), then the brackets are summed with
    numpy: fast enough for the door's largest bodies. An unterminated string's brackets count (the
    body is malformed anyway).
    """
    if not body:
        return 0
    blanked = _STRING.sub(b'""', body)
    steps = _OPEN[np.frombuffer(blanked, np.uint8)].astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    """An object naming a key twice: Triton's parser (rapidjson's ``FindMember``) reads the first, Python's the
    last, so the door would check another request than Triton runs (a huge ``shape`` hidden behind a small one)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError(f"an object names a key twice ({', '.join(k for k, _ in pairs)[:60]})")
    return found


def parse_json(body: bytes, what: str = "body", strict: bool = False) -> tuple[Any, Refusal | None]:
    """``body`` parsed by the standard :mod:`json` module once its nesting is known to be bounded;
    ``strict``: an object with a key twice is refused (:func:`_no_duplicates`)."""
    depth = nesting_depth(body)
    if depth > MAX_DEPTH:
        return None, _bad(f"a JSON {what} nested {depth} deep (at most {MAX_DEPTH}): Triton 2.51 crashes on deep "
                          "nesting; send tensors with their shape and flat data")
    try:
        return json.loads(body, object_pairs_hook=_no_duplicates if strict else None), None
    except (ValueError, RecursionError) as exc:
        return None, _bad(f"a {what} that is not valid JSON ({str(exc)[:80]}): send the KServe v2 JSON "
                          "(tritonclient writes it)")


def _shape(name: str, shape: Any) -> tuple[list[int] | None, Refusal | None]:
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None, _bad(f"input '{name}': shape {str(shape)[:80]} must be a list of at most {MAX_RANK} "
                          "non-negative integers")
    return shape, None


def _elements(shape: Iterable[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim  # Python integers: no wrap, the product is exact
    return count


def check_shape(model: ModelRules | None, name: str, shape: list[int]) -> Refusal | None:
    """The shape against the model's config: rank, fixed dims, batch and the element bound."""
    if model is None or name not in model.inputs:
        return None  # Triton names an unknown model or input itself; the sizes are still checked against the data
    rule = model.inputs[name]
    batch = model.max_batch_size > 0
    expected = (["1..%d" % model.max_batch_size] if batch else []) + [str(d) for d in rule.dims]
    dims = shape[1:] if batch else shape
    if len(shape) != len(rule.dims) + batch or any(want >= 0 and got != want for got, want in zip(dims, rule.dims)) \
            or (batch and not 1 <= shape[0] <= model.max_batch_size):
        return _bad(f"input '{name}' of model '{model.name}' with shape {shape}: its config allows "
                    f"[{', '.join(expected)}] (-1: any size); reshape the tensor to match")
    elements, most = _elements(shape), model.max_elements(rule)
    if elements > most:
        return _large(f"input '{name}' of model '{model.name}' with {elements:,} elements: the door allows "
                      f"{most:,} for it; split it into smaller requests")
    return None


def _count_values(data: Any) -> int:
    """Leaves of a nested JSON list (iterative: nesting is bounded already, but no recursion is needed)."""
    count, stack = 0, [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        else:
            count += 1
    return count


def check_http(model_name: str, model: ModelRules | None, body: bytes, header_length: int | None = None,
               also: Callable[[dict], Refusal | None] | None = None) -> Refusal | None:
    """A KServe v2 HTTP infer request (``POST /v2/models/<m>/infer``): JSON, or binary when the
    ``Inference-Header-Content-Length`` header gives ``header_length``; ``also``, a further rule on the
    parsed request (a class's sequence IDs: :mod:`lab_backends.server.door_sequences`)."""
    if header_length is not None and not 0 < header_length <= len(body):
        return _bad(f"Inference-Header-Content-Length {header_length} for a body of {len(body)} bytes: it must "
                    "give the length of the JSON header at the body's start")
    header = body[:header_length] if header_length is not None else body
    request, refusal = parse_json(header, "request header" if header_length is not None else "request", strict=True)
    if refusal:
        return refusal
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        return _bad('a request without an "inputs" list: send {"inputs": [{"name", "shape", "datatype", "data"}]}')
    if "outputs" in request and not (isinstance(request["outputs"], list) and all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in request["outputs"])):
        return _bad('"outputs" that is not a list of objects with a "name": name each output wanted, or leave it out')
    binary_total = 0
    for tensor in request["inputs"]:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str) \
                or not isinstance(tensor.get("datatype"), str):
            return _bad('an input without a string "name" and "datatype": give each input both')
        name, datatype = tensor["name"], tensor["datatype"]
        if datatype not in ITEM_BYTES:
            return _bad(f"input '{name}' with datatype {datatype[:20]!r}: use one of {', '.join(ITEM_BYTES)}")
        shape, refusal = _shape(name, tensor.get("shape"))
        if refusal:
            return refusal
        refusal = check_shape(model, name, shape)
        if refusal:
            return refusal
        params = tensor.get("parameters") or {}
        if not isinstance(params, dict):
            return _bad(f"input '{name}': parameters must be an object")
        refusal = _check_carried(model_name, name, datatype, shape, params, tensor, header_length is not None)
        if isinstance(refusal, Refusal):
            return refusal
        binary_total += refusal or 0
    if header_length is not None and binary_total != len(body) - header_length:
        after = len(body) - header_length
        return _bad(f"binary_data_size of the inputs adds up to {binary_total:,} bytes but {after:,} follow the "
                    "header: give each binary input its exact size")
    return also(request) if also else None


def _check_carried(model_name: str, name: str, datatype: str, shape: list[int], params: dict, tensor: dict,
                   binary: bool) -> Refusal | int | None:
    """What an input carries against what its shape claims; the binary bytes it takes, if any."""
    elements, item = _elements(shape), ITEM_BYTES[datatype]
    region, size = params.get("shared_memory_region"), params.get("binary_data_size")
    if region is not None:
        declared = params.get("shared_memory_byte_size")
        if not isinstance(declared, int) or isinstance(declared, bool) or declared < 0:
            return _bad(f"input '{name}' in shared memory without a shared_memory_byte_size: give the region's "
                        "byte size for this input")
        if elements * item > declared:
            return _bad(f"input '{name}' with shape {shape} needs {elements * item:,} bytes but its shared memory "
                        f"holds {declared:,}: make the shape match the tensor written there")
        return None
    if size is not None:
        if not binary:
            return _bad(f"input '{name}' has binary_data_size but the request has no Inference-Header-Content-Length:"
                        " send the header's length (tritonclient does)")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return _bad(f"input '{name}': binary_data_size must be a non-negative integer")
        if datatype == "BYTES" and elements * item > size or datatype != "BYTES" and elements * item != size:
            return _bad(f"input '{name}' with shape {shape} of {datatype} is {elements * item:,} bytes but its "
                        f"binary_data_size is {size:,}: make the shape match the data sent")
        return size
    if "data" not in tensor:
        return _bad(f"input '{name}' carries no data (no \"data\", binary_data_size or shared_memory_region): "
                    "send its values")
    values = _count_values(tensor["data"])
    if values != elements:
        return _bad(f"input '{name}' with shape {shape} holds {elements:,} elements but its data has {values:,}: "
                    "make the shape match the data")
    return None


def check_grpc(model: ModelRules | None, request: Any) -> Refusal | None:
    """A gRPC ``ModelInferRequest`` (tritonclient's ``service_pb2``), unary or one message of a stream."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        return _bad(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: send one per input, or none")
    for index, tensor in enumerate(request.inputs):
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        if datatype not in ITEM_BYTES:
            return _bad(f"input '{name}' with datatype {datatype[:20]!r}: use one of {', '.join(ITEM_BYTES)}")
        refusal = _shape(name, shape)[1] or check_shape(model, name, shape)
        if refusal:
            return refusal
        elements, item = _elements(shape), ITEM_BYTES[datatype]
        params = tensor.parameters
        if "shared_memory_region" in params:
            declared = params["shared_memory_byte_size"].int64_param if "shared_memory_byte_size" in params else -1
            if elements * item > declared:
                return _bad(f"input '{name}' with shape {shape} needs {elements * item:,} bytes but its shared memory "
                            f"holds {max(declared, 0):,}: make the shape match the tensor written there")
        elif raw:
            size = len(raw[index])
            if datatype == "BYTES" and elements * item > size or datatype != "BYTES" and elements * item != size:
                return _bad(f"input '{name}' with shape {shape} of {datatype} is {elements * item:,} bytes but its "
                            f"raw contents are {size:,}: make the shape match the data sent")
        else:
            values = len(getattr(tensor.contents, GRPC_CONTENTS[datatype]))
            if values != elements:
                return _bad(f"input '{name}' with shape {shape} holds {elements:,} elements but its contents have "
                            f"{values:,}: make the shape match the data")
    return None
