"""cost_model: a batch costs ``fixed_ms + per_item_ms * batch_size`` of wall time, then echoes.

The sleep stands in for a kernel launch (fixed) plus per-sample work (per item): exactly the
shape of cost that makes dynamic batching pay off. Both numbers come from config parameters, so a
config override on load changes them without touching code.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})

        def param(key, default):
            return float(params.get(key, {}).get("string_value", default))

        self.fixed_s = param("fixed_ms", 10.0) / 1000.0
        self.per_item_s = param("per_item_ms", 0.2) / 1000.0

    def execute(self, requests):
        # The cost is measured from the moment execute starts, so reading the inputs and building
        # the responses happen inside it rather than on top of it: the batch takes exactly its cost.
        started = time.perf_counter()
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        batch_size = sum(x.shape[0] for x in inputs)
        deadline = started + self.fixed_s + self.per_item_s * batch_size
        responses = [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", np.ascontiguousarray(x))])
            for x in inputs
        ]
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return responses
