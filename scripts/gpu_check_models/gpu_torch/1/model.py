"""GPU check model: OUTPUT0 = 2 * INPUT0 on the instance's device (torch), DEVICE = where it ran.

Why each piece is here:
* the whole dynamic batch is moved to the device in one tensor, so batch statistics show what
  batching buys on a GPU;
* ``initialize`` refuses a KIND_GPU instance when torch sees no CUDA device, so a misconfigured
  machine fails the load with a reason instead of silently computing on the CPU;
* numpy's version goes to the server log: the check script quotes it (numpy 2 corrupts inputs).
"""

import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


def _param(config: dict, key: str, default: str) -> str:
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


def _to_torch(array: np.ndarray) -> torch.Tensor:
    """numpy -> torch; falls back to a copy through lists if this torch was built for another numpy ABI."""
    try:
        return torch.from_numpy(array)
    except (RuntimeError, TypeError):
        return torch.tensor(array.tolist(), dtype=torch.float32)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    try:
        return tensor.numpy()
    except (RuntimeError, TypeError):
        return np.array(tensor.tolist(), dtype=np.float32)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        kind = args["model_instance_kind"]
        if kind == "GPU":
            if not torch.cuda.is_available():
                raise pb_utils.TritonModelException(
                    "gpu_torch: KIND_GPU instance, but torch sees no CUDA device "
                    f"(torch {torch.__version__}, CUDA build {torch.version.cuda})"
                )
            self.device = torch.device(f"cuda:{int(args['model_instance_device_id'])}")
            label = f"{self.device} {torch.cuda.get_device_name(self.device)}"
        else:
            self.device = torch.device("cpu")
            label = "cpu"
        self.label = np.array([label.encode()], dtype=np.object_)
        self.matmuls = int(_param(config, "work_matmuls", "0"))
        size = int(_param(config, "work_size", "1024"))
        generator = torch.Generator().manual_seed(0)
        self.work = torch.randn(size, size, generator=generator).to(self.device)
        pb_utils.Logger.log_info(
            f"{args['model_name']} ready: numpy {np.__version__}, torch {torch.__version__}, device {label}"
        )

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        batch = _to_torch(np.concatenate(arrays)).to(self.device)
        result = batch * 2.0
        acc = self.work
        for _ in range(self.matmuls):  # deliberate device work, visible in utilization metrics
            acc = torch.tanh(acc @ self.work)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out = _to_numpy(result.cpu())
        responses, start = [], 0
        for array in arrays:
            rows = array.shape[0]
            labels = np.repeat(self.label.reshape(1, 1), rows, axis=0)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", out[start:start + rows]),
                pb_utils.Tensor("DEVICE", labels),
            ]))
            start += rows
        return responses
