"""Audit cases of ``preprocess_backend`` (notebook 04): a model.py for the Python backend."""

from lab_backends.lessons.exercises.audit import Wrong
from lab_backends.lessons.exercises.registry import load_solution

REFERENCE = load_solution("preprocess_backend")


def _variant(old: str, new: str) -> str:
    assert old in REFERENCE, old
    return REFERENCE.replace(old, new)


WRONG = [
    Wrong("flattens the whole batch into one row", _variant("reshape(len(batch), 64)", "reshape(-1)"), r"shape"),
    Wrong("integer division wraps the uint8 pixels",
          _variant("batch.reshape(len(batch), 64).astype(np.float32) / np.float32(8.0) - np.float32(1.0)",
                   "(batch.reshape(len(batch), 64) // 8 - 1).astype(np.float32)"),
          r"differs from IMAGE / 8 - 1"),
    Wrong("one response for the whole batch instead of one per request",
          _variant("return [pb_utils.InferenceResponse([pb_utils.Tensor(\"PIXELS\", part)]) for part in parts]",
                   "return [pb_utils.InferenceResponse([pb_utils.Tensor(\"PIXELS\", pixels)])]"),
          r"failed"),
    Wrong("does not parse", "class TritonPythonModel(:\n", r"does not parse"),
]

ALTERNATIVES = [
    # One request at a time, no gather/scatter, and a docstring that mentions NotImplementedError.
    '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Raises no NotImplementedError: every request is normalized on its own."""

    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().astype(np.float32)
            pixels = (image / 8.0 - 1.0).reshape(image.shape[0], -1).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", pixels)]))
        return responses
''',
]
