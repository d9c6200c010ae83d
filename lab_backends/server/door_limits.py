"""The front door's body limit: the largest request any served model can take, sized from the model configs.

Apart from :mod:`lab_backends.server.door_config` (the nginx file) because it is a fact about the models, not
about nginx: the door's ``client_max_body_size`` uses it, and its tests size requests against it.
"""

from __future__ import annotations

import re
from typing import Iterable

from tritonclient.grpc import model_config_pb2

#: Bytes per tensor element in a JSON request at worst (a float written out with its separator).
JSON_BYTES_PER_ELEMENT = 24
#: Elements assumed for a variable dimension (-1) when sizing the body limit.
VARIABLE_DIM = 4096
#: The body limit never goes below this (metadata, shared-memory registrations, small models).
MIN_BODY = 1 << 20
_DTYPE_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
                "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8, "STRING": 256}


def body_limit(configs: Iterable[object]) -> int:
    """The largest JSON request any served model can take at its max batch, and at least 1 MiB.

    ``configs`` are ``ModelConfig`` protobufs. A JSON body is the biggest encoding of a tensor
    (:data:`JSON_BYTES_PER_ELEMENT` a number), so binary and shared-memory requests fit too.
    """
    largest = 0
    for config in configs:
        batch = max(1, getattr(config, "max_batch_size", 0))
        size = 0
        for tensor in config.input:
            elements = batch
            for dim in tensor.dims:
                elements *= VARIABLE_DIM if dim < 0 else max(1, dim)
            dtype = re.sub(r"^TYPE_", "", _dtype_name(tensor.data_type))
            size += elements * max(JSON_BYTES_PER_ELEMENT, _DTYPE_BYTES.get(dtype, 8))
        largest = max(largest, size)
    return max(MIN_BODY, largest)


def _dtype_name(value: int) -> str:
    return model_config_pb2.DataType.Name(value)  # the config protobuf's enum names the type
