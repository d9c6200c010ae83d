"""digits_bls: the digits pipeline in code (Business Logic Scripting), IMAGE -> LABELS, PROBS.

Per request: digits_preprocess -> digits_onnx | digits_torch -> digits_postprocess. The framework
is chosen by the request parameter ``framework`` ("onnx", the default, or "torch").

* ``execute`` is ``async``: the requests of a batch run their child calls concurrently, so the
  children reach the downstream dynamic batchers together and are batched there.
* Every child request carries ``trace=request.trace()``: without it the children are invisible
  in the trace file (measured on 2.51), and the pipeline looks like one opaque step.
* A bad parameter or a failing child gives *that* request an error response; the others in the
  batch still get their answers.
"""

import asyncio
import json

import triton_python_backend_utils as pb_utils

FRAMEWORKS = {"onnx": "digits_onnx", "torch": "digits_torch"}


class RequestError(Exception):
    """An error that belongs to one request (its message goes back to that client)."""


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.default = config.get("parameters", {}).get("default_framework", {}).get("string_value", "onnx")
        if self.default not in FRAMEWORKS:
            raise pb_utils.TritonModelException(
                f"parameter default_framework must be one of {sorted(FRAMEWORKS)}, got {self.default!r}"
            )

    async def execute(self, requests):
        return list(await asyncio.gather(*(self._pipeline(r) for r in requests)))

    def _framework(self, request):
        params = json.loads(request.parameters() or "{}")
        value = params.get("framework", self.default)
        if value not in FRAMEWORKS:
            raise RequestError(
                f"request parameter 'framework' must be one of {sorted(FRAMEWORKS)}, got {value!r}"
            )
        return FRAMEWORKS[value]

    async def _call(self, parent, model, inputs, outputs):
        child = pb_utils.InferenceRequest(
            model_name=model,
            inputs=inputs,
            requested_output_names=outputs,
            trace=parent.trace(),  # the child appears in the trace, linked to its parent
        )
        response = await child.async_exec()
        if response.has_error():
            raise RequestError(f"{model} failed: {response.error().message()}")
        return [pb_utils.get_output_tensor_by_name(response, name) for name in outputs]

    async def _pipeline(self, request):
        try:
            model = self._framework(request)
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE")
            (pixels,) = await self._call(request, "digits_preprocess", [image], ["PIXELS"])
            (logits,) = await self._call(request, model, [pixels], ["LOGITS"])
            labels, probs = await self._call(request, "digits_postprocess", [logits], ["LABELS", "PROBS"])
            return pb_utils.InferenceResponse(output_tensors=[labels, probs])
        except RequestError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
