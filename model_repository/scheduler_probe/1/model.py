"""scheduler_probe: sleeps ``fixed_ms + per_item_ms * batch size``, then says who ran the batch.

Triton's traces give each request its compute timestamps but not the instance that ran it, and the
statistics API sums over instances. The instance knows its own name (``model_instance_name``, the
name Triton gives it, e.g. ``scheduler_probe_0_1``) and its stub's PID, so it returns them with
every response, along with the batch size it saw: that is what lets a notebook draw which
instance ran which batch, and check the grouping it reads from the trace.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})

        def param(key, default):
            return float(params.get(key, {}).get("string_value", default))

        self.fixed_s = param("fixed_ms", 10.0) / 1000.0
        self.per_item_s = param("per_item_ms", 0.5) / 1000.0
        self.instance = args["model_instance_name"].encode()
        self.pid = os.getpid()

    def execute(self, requests):
        started = time.perf_counter()
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        batch = sum(x.shape[0] for x in inputs)
        deadline = started + self.fixed_s + self.per_item_s * batch
        responses = []
        for x in inputs:
            n = x.shape[0]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", np.ascontiguousarray(x)),
                pb_utils.Tensor("INSTANCE", np.array([[self.instance]] * n, dtype=np.object_)),
                pb_utils.Tensor("PID", np.full((n, 1), self.pid, dtype=np.int64)),
                pb_utils.Tensor("BATCH", np.full((n, 1), batch, dtype=np.int32)),
            ]))
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return responses
