"""Every config.pbtxt, checked with Triton's own schema (``model_config_pb2``), plus the interface.

No server: this is what can be checked on any machine, including the GPU variants that only the
NGC image serves. Those must parse, ask for a GPU, and point at artifacts that exist and agree
with the config's tensor names and shapes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from tritonclient.grpc import model_config_pb2 as mc

from lab_backends.digits import build_models
from lab_backends.digits.build import BACKENDS_SOURCE, GPU_REPOSITORY
from lab_backends.paths import MODEL_REPOSITORY, PROJECT_ROOT
from lab_backends.server.repository import read_config

CONFIGS = sorted(PROJECT_ROOT.glob("model_repository*/*/config.pbtxt"))
T = mc.DataType

#: The agreed tensor interface (see the README): name -> (inputs, outputs), each {tensor: (type, dims)}.
INTERFACE = {
    "digits_preprocess": ({"IMAGE": (T.TYPE_UINT8, [8, 8])}, {"PIXELS": (T.TYPE_FP32, [64])}),
    "digits_torch": ({"PIXELS": (T.TYPE_FP32, [64])}, {"LOGITS": (T.TYPE_FP32, [10])}),
    "digits_onnx": ({"PIXELS": (T.TYPE_FP32, [64])}, {"LOGITS": (T.TYPE_FP32, [10])}),
    "digits_tf": ({"PIXELS": (T.TYPE_FP32, [64])}, {"LOGITS": (T.TYPE_FP32, [10])}),
    "digits_tf_native": ({"PIXELS": (T.TYPE_FP32, [64])}, {"LOGITS": (T.TYPE_FP32, [10])}),
    "digits_torch_native": ({"PIXELS": (T.TYPE_FP32, [64])}, {"LOGITS": (T.TYPE_FP32, [10])}),
    "digits_postprocess": (
        {"LOGITS": (T.TYPE_FP32, [10])}, {"LABELS": (T.TYPE_STRING, [3]), "PROBS": (T.TYPE_FP32, [3])}),
    "digits_ensemble": (
        {"IMAGE": (T.TYPE_UINT8, [8, 8])}, {"LABELS": (T.TYPE_STRING, [3]), "PROBS": (T.TYPE_FP32, [3])}),
    "digits_bls": (
        {"IMAGE": (T.TYPE_UINT8, [8, 8])}, {"LABELS": (T.TYPE_STRING, [3]), "PROBS": (T.TYPE_FP32, [3])}),
}


def _tensors(entries) -> dict:
    return {t.name: (t.data_type, list(t.dims)) for t in entries}


@pytest.fixture(scope="module")
def built():
    return build_models()


def test_there_are_configs():
    names = {p.parent.name for p in CONFIGS}
    assert set(INTERFACE) | {"stream_topk", "running_mean", "digits_logreg", "digits_forest"} <= names
    assert {"digits_onnx_gpu", "digits_torch_gpu", "digits_tf_gpu"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_config_parses_with_tritons_schema(path: Path):
    config = read_config(path.parent)  # raises ModelConfigError with line and column
    assert config.name in ("", path.parent.name), "name must match the folder"
    assert config.backend or config.platform, "a config needs a backend or a platform"
    if config.backend == "python":
        assert list(path.parent.glob("[0-9]*/model.py")), "a python model needs <version>/model.py"


@pytest.mark.parametrize("name", sorted(INTERFACE))
def test_interface_names_types_and_dims(name):
    config = read_config(MODEL_REPOSITORY / name)
    inputs, outputs = INTERFACE[name]
    assert _tensors(config.input) == inputs
    assert _tensors(config.output) == outputs
    assert config.max_batch_size > 0
    if name in ("digits_torch", "digits_onnx", "digits_tf", "digits_tf_native", "digits_torch_native"):
        assert config.max_batch_size == 64 and config.HasField("dynamic_batching")
        # The same batcher setting and one instance: the frameworks are compared on equal terms (notebook 05).
        reference = read_config(MODEL_REPOSITORY / "digits_torch")
        assert config.dynamic_batching == reference.dynamic_batching
        assert list(config.instance_group) == list(reference.instance_group)


def test_ensemble_wiring_is_complete():
    """Every ensemble step reads tensors that exist and uses names its model declares."""
    for path in CONFIGS:
        config = read_config(path.parent)
        if config.platform != "ensemble":
            continue
        available = {t.name for t in config.input}
        for step in config.ensemble_scheduling.step:
            model = read_config(path.parent.parent / step.model_name)
            assert set(step.input_map) <= {t.name for t in model.input}, (config.name, step.model_name)
            assert set(step.output_map) <= {t.name for t in model.output}, (config.name, step.model_name)
            assert set(step.input_map.values()) <= available, (config.name, step.model_name)
            available |= set(step.output_map.values())
        assert {t.name for t in config.output} <= available, config.name


def test_streaming_and_sequence_configs():
    stream = read_config(MODEL_REPOSITORY / "stream_topk")
    assert stream.model_transaction_policy.decoupled
    seq = read_config(MODEL_REPOSITORY / "running_mean")
    # Several sequences in flight: batching slots (max_batch_size > 0) and several candidates.
    assert seq.max_batch_size > 0 and seq.sequence_batching.oldest.max_candidate_sequences > 1
    kinds = {c.control[0].kind for c in seq.sequence_batching.control_input}
    S = mc.ModelSequenceBatching.Control
    assert kinds == {S.CONTROL_SEQUENCE_START, S.CONTROL_SEQUENCE_END, S.CONTROL_SEQUENCE_CORRID}


def test_python_based_backend_models(built):
    for name in ("digits_logreg", "digits_forest"):
        config = read_config(MODEL_REPOSITORY / name)
        assert (BACKENDS_SOURCE / config.backend / "model.py").is_file()
        assert (MODEL_REPOSITORY / name / "1" / "model.pkl").is_file()


# ---------------------------------------------------------------- GPU variants (NGC image only)
def _gpu(name: str) -> tuple[mc.ModelConfig, Path]:
    config = read_config(GPU_REPOSITORY / name)
    return config, GPU_REPOSITORY / name / "1" / config.default_model_filename


@pytest.mark.parametrize("name", ["digits_onnx_gpu", "digits_torch_gpu", "digits_tf_gpu"])
def test_gpu_variant_asks_for_a_gpu_and_has_its_artifact(built, name):
    config, artifact = _gpu(name)
    assert config.platform in ("onnxruntime_onnx", "pytorch_libtorch", "tensorflow_savedmodel")
    assert config.instance_group and all(g.kind == mc.ModelInstanceGroup.KIND_GPU for g in config.instance_group)
    if config.platform == "tensorflow_savedmodel":  # a directory (its signature: tests/test_digits_tf.py)
        artifact = artifact / "saved_model.pb"
    assert artifact.is_file() and artifact.stat().st_size > 0, f"{artifact} missing: run lab-backends build-models"


def test_onnx_gpu_config_matches_the_graph(built):
    config, artifact = _gpu("digits_onnx_gpu")
    assert config.platform == "onnxruntime_onnx"
    graph = onnx.load(str(artifact)).graph

    def dims(value_info):
        return [d.dim_value for d in value_info.type.tensor_type.shape.dim[1:]]

    assert {i.name: dims(i) for i in graph.input} == {t.name: list(t.dims) for t in config.input}
    assert {o.name: dims(o) for o in graph.output} == {t.name: list(t.dims) for t in config.output}


def test_torch_gpu_config_matches_the_module(built):
    config, artifact = _gpu("digits_torch_gpu")
    assert config.platform == "pytorch_libtorch"
    # libtorch maps TorchScript's positional tensors by the <name>__<index> convention.
    assert [t.name for t in config.input] == ["PIXELS__0"] and [t.name for t in config.output] == ["LOGITS__0"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(artifact))
    out = module(torch.zeros(3, *config.input[0].dims))
    assert list(out.shape) == [3, *config.output[0].dims] and out.dtype == torch.float32
    assert np.isfinite(out.detach().numpy()).all()
