"""digits_tf: PIXELS fp32 [64] -> LOGITS fp32 [10] with TensorFlow (SavedModel ``model.savedmodel``).

As in digits_torch and digits_onnx, every request of the batch is concatenated into one tensor, the
SavedModel's serving signature runs once, and the rows are split back per request.

TensorFlow is imported in ``initialize``, not at the top: the environment variables that quiet its
start-up notices must be set before the import, and the thread pools must be sized before its
runtime runs its first op (afterwards they are fixed for the process).
"""

import os

import numpy as np
import triton_python_backend_utils as pb_utils

#: Read by TensorFlow at import. Errors only from its C++ side, and no oneDNN notice (TensorFlow 2.21
#: prints it at any log level; its plain kernels give these logits just as well): a readable server log.
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.savedmodel")
        if not os.path.isdir(path):
            raise pb_utils.TritonModelException(
                f"{path} does not exist: run `lab-backends build-models` to train and export it"
            )
        for key, value in QUIET.items():
            os.environ.setdefault(key, value)
        import tensorflow as tf

        # One framework thread (intra-op) and one op at a time (inter-op): stable timings, and no fight
        # with the server for 2 cores. Only possible before TensorFlow's runtime starts.
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self.tf = tf
        self.serve = tf.saved_model.load(path).signatures["serving_default"]
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
            logits = self.serve(PIXELS=self.tf.constant(batch))["LOGITS"].numpy()
            self.runs.increment(1)
            self.rows.increment(batch.shape[0])
            parts = iter(np.split(logits, np.cumsum([x.shape[0] for x in good])[:-1]))
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("LOGITS", np.ascontiguousarray(next(parts)))])
            if fine else pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "PIXELS contains NaN or infinity: send finite values (digits_preprocess gives -1..1)"))
            for fine in ok
        ]
