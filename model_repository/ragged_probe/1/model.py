"""ragged_probe: sums each request's own vector, and says what the batch it ran in looked like.

The Python backend hands ``execute`` the requests of a batch one by one, each with its own tensor,
so a batch of different lengths needs no padding here (a backend that takes one big tensor would
read the lengths from a ``batch_input`` such as BATCH_ACCUMULATED_ELEMENT_COUNT). TOTAL proves no
request's data was mixed with another's; BATCH and LENGTHS show what the scheduler put together.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.fixed_s = float(params.get("fixed_ms", {}).get("string_value", 10)) / 1000.0

    def execute(self, requests):
        started = time.perf_counter()
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        batch = sum(x.shape[0] for x in inputs)
        lengths = len({x.shape[1] for x in inputs})
        responses = [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TOTAL", x.sum(axis=1, keepdims=True).astype(np.float32)),
                pb_utils.Tensor("BATCH", np.full((x.shape[0], 1), batch, dtype=np.int32)),
                pb_utils.Tensor("LENGTHS", np.full((x.shape[0], 1), lengths, dtype=np.int32)),
            ])
            for x in inputs
        ]
        remaining = started + self.fixed_s - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return responses
