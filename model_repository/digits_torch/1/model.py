"""digits_torch: PIXELS fp32 [64] -> LOGITS fp32 [10] with PyTorch (TorchScript ``model.pt``).

The Python backend hands ``execute`` a *list* of requests (the dynamic batcher's batch) and does
not stack them for you. Running the model once per request would throw the batching away, so
this model concatenates all inputs into one tensor, runs the framework once, and splits the
result back by each request's row count.
"""

import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # One framework thread: stable timings, and no fight with the server for 2 cores.
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # can only be set once per process, before any parallel work
            pass
        path = os.path.join(args["model_repository"], args["model_version"], "model.pt")
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(
                f"{path} does not exist: run `lab-backends build-models` to train and export it"
            )
        self.model = torch.jit.load(path, map_location="cpu").eval()
        labels = {"model": args["model_name"]}
        self.runs_family = pb_utils.MetricFamily(
            name="lab_framework_runs", description="framework calls made by execute",
            kind=pb_utils.MetricFamily.COUNTER)
        self.rows_family = pb_utils.MetricFamily(
            name="lab_framework_rows", description="rows given to the framework",
            kind=pb_utils.MetricFamily.COUNTER)
        self.runs = self.runs_family.Metric(labels=labels)
        self.rows = self.rows_family.Metric(labels=labels)

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "PIXELS").as_numpy() for r in requests]
        # A request with NaN/inf pixels gets its own error; its batch-mates are still computed.
        ok = [bool(np.isfinite(x).all()) for x in inputs]
        good = [x for x, fine in zip(inputs, ok) if fine]
        parts = iter(())
        if good:
            batch = np.concatenate(good) if len(good) > 1 else good[0]
            with torch.inference_mode():
                logits = self.model(torch.from_numpy(batch)).numpy()
            self.runs.increment(1)
            self.rows.increment(batch.shape[0])
            parts = iter(np.split(logits, np.cumsum([x.shape[0] for x in good])[:-1]))
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("LOGITS", np.ascontiguousarray(next(parts)))])
            if fine else pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "PIXELS contains NaN or infinity: send finite values (digits_preprocess gives -1..1)"))
            for fine in ok
        ]
