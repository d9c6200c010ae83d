"""Solution: the KServe v2 JSON request body for cost_model, written by hand (notebook 01)."""

import numpy as np


def answer(x: np.ndarray) -> dict:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": list(x.shape),  # the batch dimension included: [batch, 16]
                "datatype": "FP32",
                "data": x.flatten().tolist(),  # row-major, as plain JSON numbers
            }
        ],
        "outputs": [{"name": "OUTPUT0"}],  # no "binary_data": the answer comes back as JSON too
    }
