"""rel_respond_then_hold: OUTPUT0 = 2 * INPUT0, answered through each request's response sender; a
request with the parameter ``hold_ms`` is then kept that long before ``execute`` returns.

Default mode may answer with the sender (FINAL flag) and return None for that request (python_backend
README.md:482-486 at r24.10); the backend releases requests only after ``execute`` returns
(src/python_be.cc:2351). So a held request is released after its client has its answer and the gRPC
front end has recycled the call's state: the order in which Triton 2.51's TraceRelease frees the
Trace it still holds locked (tests/reliability/test_trace_release_write.py).
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        hold_ms = 0
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", np.ascontiguousarray(2.0 * x, dtype=np.float32))
            request.get_response_sender().send(
                pb_utils.InferenceResponse(output_tensors=[out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            hold_ms = max(hold_ms, int(json.loads(request.parameters()).get("hold_ms", 0)))
        time.sleep(hold_ms / 1000)
        return [None] * len(requests)
