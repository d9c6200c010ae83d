"""rel_crash: OUTPUT0 = 2 * INPUT0, unless INPUT0[0] < 0: then the stub process dies on the spot."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.flat[0] < 0:
                os._exit(1)  # no exception, no cleanup: what a crash in native code looks like
            out = pb_utils.Tensor("OUTPUT0", np.ascontiguousarray(2.0 * x, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
