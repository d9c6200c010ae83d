"""digits_onnx: PIXELS fp32 [64] -> LOGITS fp32 [10] with ONNX Runtime (``model.onnx``).

As in digits_torch, every request of the batch is concatenated into one tensor, the session runs
once, and the rows are split back per request: that is what makes dynamic batching pay.
"""

import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(
                f"{path} does not exist: run `lab-backends build-models` to train and export it"
            )
        options = ort.SessionOptions()
        # Pinned threads: stable timings, and no fight with the server for 2 cores.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
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
            logits = self.session.run(["LOGITS"], {"PIXELS": batch})[0]
            self.runs.increment(1)
            self.rows.increment(batch.shape[0])
            parts = iter(np.split(logits, np.cumsum([x.shape[0] for x in good])[:-1]))
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("LOGITS", np.ascontiguousarray(next(parts)))])
            if fine else pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "PIXELS contains NaN or infinity: send finite values (digits_preprocess gives -1..1)"))
            for fine in ok
        ]
