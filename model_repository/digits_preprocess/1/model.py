"""digits_preprocess: IMAGE uint8 [8, 8] (0..16) -> PIXELS fp32 [64] = IMAGE / 8 - 1.

Values above 16 are refused per request (not silently clipped): an image scaled 0..255 by
mistake would otherwise be classified confidently and wrongly.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_PIXEL = 16


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            if image.size and image.max() > MAX_PIXEL:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"IMAGE values must be 0..{MAX_PIXEL} (scikit-learn's 8x8 digits scale), got a "
                    f"maximum of {int(image.max())}; rescale 0..255 images with `image * 16 // 255`"
                )))
                continue
            pixels = image.reshape(image.shape[0], -1).astype(np.float32) / np.float32(8.0) - np.float32(1.0)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PIXELS", pixels)]))
        return responses
