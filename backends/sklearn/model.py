"""A Python-based backend: scikit-learn classifiers served by Triton, without writing C.

Installed as ``<backend-directory>/sklearn/model.py`` by ``lab-backends setup``. A model whose
config says ``backend: "sklearn"`` has no code of its own: Triton finds no
``libtriton_sklearn.so``, finds this ``model.py`` instead and runs it with the Python backend,
once per model instance. The model folder only holds the fitted estimator,
``<version>/model.pkl`` (or the file named by the config parameter ``model_filename``).

Outputs are chosen by name in the config: ``PROBABILITIES`` (fp32 ``[n_classes]``,
``predict_proba``) and/or ``LABEL`` (int64 ``[1]``, the most probable class). The single input
(any name) is a fp32 feature vector. Requests are concatenated and predicted in one call.

Each request is checked on its own first (rank, emptiness, feature count, NaN/infinity, which
scikit-learn refuses for the whole call): a bad one gets its own error response and its
batch-mates are still predicted, instead of one NaN failing every request batched with it.
"""

import json
import os
import pickle

import numpy as np
import triton_python_backend_utils as pb_utils

KNOWN_OUTPUTS = ("PROBABILITIES", "LABEL")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        filename = params.get("model_filename", {}).get("string_value", "model.pkl")
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(
                f"{path} does not exist: run `lab-backends build-models` to fit and save it"
            )
        if len(config["input"]) != 1:
            raise pb_utils.TritonModelException("the sklearn backend takes exactly one input (the features)")
        self.input_name = config["input"][0]["name"]
        self.outputs = [o["name"] for o in config["output"]]
        unknown = sorted(set(self.outputs) - set(KNOWN_OUTPUTS))
        if unknown:
            raise pb_utils.TritonModelException(
                f"the sklearn backend cannot produce outputs {unknown}; name outputs {list(KNOWN_OUTPUTS)}"
            )
        with open(path, "rb") as handle:
            # Only load pickles you built: unpickling runs code. build_models writes this one.
            self.estimator = pickle.load(handle)
        self.classes = np.asarray(self.estimator.classes_)
        self.n_features = getattr(self.estimator, "n_features_in_", None)

    def _problem(self, x):
        """Why this request's features cannot be predicted, or None."""
        if x.ndim != 2:
            return f"{self.input_name} must be [batch, features], got shape {list(x.shape)}"
        if x.size == 0:
            return f"{self.input_name} is empty (shape {list(x.shape)}): send at least one feature row"
        if self.n_features is not None and x.shape[1] != self.n_features:
            return f"{self.input_name} has {x.shape[1]} features per row, the estimator takes {self.n_features}"
        bad = ~np.isfinite(x)
        if bad.any():
            row, col = (int(i[0]) for i in np.nonzero(bad))
            return (f"{self.input_name} contains NaN or infinity (first at row {row}, feature {col}); "
                    "scikit-learn cannot predict those: replace them (e.g. with 0) before sending")
        return None

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        problems = [self._problem(x) for x in inputs]
        good = [x for x, p in zip(inputs, problems) if p is None]
        predicted = iter(())
        if good:
            probs = self.estimator.predict_proba(np.concatenate(good)).astype(np.float32)
            labels = self.classes[probs.argmax(axis=1)].astype(np.int64).reshape(-1, 1)
            bounds = np.cumsum([x.shape[0] for x in good])[:-1]
            predicted = zip(np.split(probs, bounds), np.split(labels, bounds))
        responses = []
        for problem in problems:
            if problem is not None:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(problem)))
                continue
            prob, label = next(predicted)
            tensors = {"PROBABILITIES": prob, "LABEL": label}
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(name, np.ascontiguousarray(tensors[name])) for name in self.outputs
            ]))
        return responses
