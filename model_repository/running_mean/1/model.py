"""running_mean: per sequence, the mean and count of the VALUEs received so far.

State lives in this instance, keyed by the correlation ID that the sequence batcher passes in
the CORRID control tensor; START resets it and END frees it. With the "oldest" strategy one
``execute`` may hold requests of several sequences (one request each), which is why state is
looked up per request rather than kept in a single variable.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.state = {}  # correlation id -> (sum, count)

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = int(_scalar(request, "CORRID"))
            if _scalar(request, "START"):
                self.state[corrid] = (0.0, 0)
            total, count = self.state.get(corrid, (0.0, 0))
            values = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy().reshape(-1)
            if values.size == 0 or not np.isfinite(values).all():
                # One NaN would poison this sequence's mean for good: refuse it, keep the state.
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"VALUE must be finite numbers, got {values.tolist()}; the running mean is unchanged")))
                continue
            total, count = total + float(values.sum()), count + int(values.size)
            if _scalar(request, "END"):
                self.state.pop(corrid, None)
            else:
                self.state[corrid] = (total, count)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("MEAN", np.array([[total / count]], dtype=np.float32)),
                pb_utils.Tensor("COUNT", np.array([[count]], dtype=np.int32)),
            ]))
        return responses
