"""stream_topk: LOGITS fp32 [10] (+ optional K) -> K responses, one digit per step, best first.

A decoupled model owns a *response sender* per request instead of returning responses: it may
send any number of them, at any time, and must close the stream with
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. ``step_delay_ms`` spaces the steps so that the stream is
visible to a learner (each response arrives ~20 ms after the previous one).
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.default_k = int(params.get("default_k", {}).get("string_value", "3"))
        self.delay_s = float(params.get("step_delay_ms", {}).get("string_value", "20")) / 1000.0

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._stream(request, sender)
            except ValueError as exc:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
        return None  # decoupled: everything went through the senders

    def _stream(self, request, sender):
        logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy().astype(np.float64).reshape(-1)
        k_tensor = pb_utils.get_input_tensor_by_name(request, "K")
        k = int(k_tensor.as_numpy().reshape(-1)[0]) if k_tensor is not None else self.default_k
        if not 1 <= k <= logits.size:
            raise ValueError(f"K must be between 1 and {logits.size}, got {k}")
        if not np.isfinite(logits).all():
            raise ValueError("LOGITS contains NaN or infinity: send finite scores")
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        for step, digit in enumerate(np.argsort(-probs, kind="stable")[:k]):
            if step:
                time.sleep(self.delay_s)
            if sender.is_cancelled():  # the client went away: stop computing for nobody
                break
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABEL", np.array([str(digit).encode()], dtype=object)),
                pb_utils.Tensor("PROB", np.array([probs[digit]], dtype=np.float32)),
                pb_utils.Tensor("STEP", np.array([step], dtype=np.int32)),
            ]))
        sender.send(flags=FINAL)
