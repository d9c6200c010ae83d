"""A Python-based backend: scikit-learn classifiers served by Triton, without writing C.

Installed as ``<backend-directory>/sklearn/model.py`` by ``lab-backends setup``. A model whose
config says ``backend: "sklearn"`` has no code of its own: Triton finds no
``libtriton_sklearn.so``, finds this ``model.py`` instead and runs it with the Python backend,
once per model instance. The model folder only holds the fitted estimator,
``<version>/model.pkl`` (or the file named by the config parameter ``model_filename``).

Outputs are chosen by name in the config: ``PROBABILITIES`` (fp32 ``[n_classes]``,
``predict_proba``) and/or ``LABEL`` (int64 ``[1]``, the most probable class). The single input
(any name) is a fp32 feature vector. Requests are concatenated and predicted in one call.
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

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        features = np.concatenate(inputs)
        probs = self.estimator.predict_proba(features).astype(np.float32)
        labels = self.classes[probs.argmax(axis=1)].astype(np.int64).reshape(-1, 1)
        bounds = np.cumsum([x.shape[0] for x in inputs])[:-1]
        per_request = zip(np.split(probs, bounds), np.split(labels, bounds))
        responses = []
        for prob, label in per_request:
            tensors = {"PROBABILITIES": prob, "LABEL": label}
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(name, np.ascontiguousarray(tensors[name])) for name in self.outputs
            ]))
        return responses
