"""rel_wrong_count: breaks the one-response-per-request rule on purpose."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", np.ascontiguousarray(x))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        first = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        if first.flat[0] < 0:
            return []  # too few: no response at all
        return responses + responses[:1]  # too many: one extra
