"""digits_postprocess: LOGITS fp32 [10] -> LABELS bytes [k] (digits, best first), PROBS fp32 [k].

k comes from the config parameter ``top_k`` (default 3) and must match the output dims, so a
config override that changes one without the other fails at load with a message, not later.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

DIGITS = np.array([str(d).encode() for d in range(10)], dtype=object)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        raw = config.get("parameters", {}).get("top_k", {}).get("string_value", "3")
        try:
            self.k = int(raw)
        except ValueError:
            raise pb_utils.TritonModelException(f"parameter top_k must be an integer 1..10, got {raw!r}")
        if not 1 <= self.k <= len(DIGITS):
            raise pb_utils.TritonModelException(f"parameter top_k must be 1..10, got {self.k}")
        for output in config["output"]:
            if list(output["dims"]) != [self.k]:
                raise pb_utils.TritonModelException(
                    f"output {output['name']} has dims {output['dims']} but top_k is {self.k}: "
                    f"set both outputs' dims to [{self.k}]"
                )

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "LOGITS").as_numpy() for r in requests]
        # NaN/inf logits have no ranking: that request gets an error, its batch-mates their answer.
        ok = [bool(np.isfinite(x).all()) for x in inputs]
        good = [x for x, fine in zip(inputs, ok) if fine]
        parts = iter(())
        if good:
            logits = np.concatenate(good).astype(np.float64)
            exp = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs = exp / exp.sum(axis=1, keepdims=True)
            order = np.argsort(-probs, axis=1, kind="stable")[:, : self.k]
            labels = DIGITS[order]
            top = np.take_along_axis(probs, order, axis=1).astype(np.float32)
            bounds = np.cumsum([x.shape[0] for x in good])[:-1]
            parts = zip(np.split(labels, bounds), np.split(top, bounds))
        responses = []
        for fine in ok:
            if not fine:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("LOGITS contains NaN or infinity: send finite scores")))
                continue
            lab, pr = next(parts)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABELS", np.ascontiguousarray(lab)),
                pb_utils.Tensor("PROBS", np.ascontiguousarray(pr)),
            ]))
        return responses
