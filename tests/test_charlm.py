"""The character model behind generate_static / generate_iterative, and their configs (no server).

The served models duplicate the numpy forward pass (a model folder must run without this package,
e.g. mounted into the NGC image); these tests load each model.py with a stand-in for
``triton_python_backend_utils`` and check its arithmetic against ``lab_backends.charlm.net``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from lab_backends.charlm import ARTIFACT, CONTEXT, PLACEMENTS, build_charlm, generate, is_fresh, load_weights
from lab_backends.charlm.net import context_ids, step
from lab_backends.charlm.text import vocabulary, zen
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.repository import read_config

MODELS = ("generate_static", "generate_iterative")


@pytest.fixture(scope="module")
def weights():
    build_charlm()  # set-up built it: nothing to do then
    return load_weights(ARTIFACT)


def test_the_text_ships_with_python() -> None:
    text = zen()
    assert text.startswith("The Zen of Python, by Tim Peters") and "Namespaces are one honking great idea" in text
    assert " " in vocabulary(text) and vocabulary(text) == "".join(sorted(set(vocabulary(text))))


def test_set_up_is_idempotent_and_places_the_weights(weights) -> None:
    report = build_charlm()
    assert not report.trained and is_fresh()
    for placed in PLACEMENTS:
        assert placed.is_file() and placed.read_bytes() == ARTIFACT.read_bytes()
    assert report.metrics["accuracy"] > 0.9  # it learned the Zen (greedy next-character accuracy)


def test_greedy_decoding_is_deterministic_and_batching_changes_nothing(weights) -> None:
    prompts = ["Beautiful is", "Errors should", "x" * 40, ""]
    one_by_one = [generate(weights, p, 12) for p in prompts]
    assert one_by_one == [generate(weights, p, 12) for p in prompts]
    batch = step(weights, np.stack([context_ids(weights, p) for p in prompts]))
    assert [weights.vocab[i] for i in batch] == [t[0] for t in one_by_one]
    assert context_ids(weights, "\u2603").tolist() == [weights.vocab.index(" ")] * CONTEXT  # unknown -> space


def _load_model_py(name: str):
    """model.py of ``name`` with a stand-in pb_utils (only the constants it reads at import)."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL, fake.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 1, 2
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = fake
    try:
        spec = importlib.util.spec_from_file_location(f"_{name}_model", MODEL_REPOSITORY / name / "1" / "model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("triton_python_backend_utils")
        else:
            sys.modules["triton_python_backend_utils"] = saved
    config = json_format.MessageToDict(read_config(MODEL_REPOSITORY / name), preserving_proto_field_name=True)
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(MODEL_REPOSITORY / name),
                      "model_version": "1"})
    return module, model


@pytest.mark.parametrize("name", MODELS)
def test_each_model_computes_what_the_reference_computes(name, weights) -> None:
    module, model = _load_model_py(name)
    assert module.CONTEXT == CONTEXT and model.vocab == weights.vocab
    texts = ["Beautiful is", "Now is better than never.\n", "Although"]
    expected = step(weights, np.stack([context_ids(weights, t) for t in texts]))
    assert model._step(texts).tolist() == expected.tolist()


def test_the_two_configs_differ_only_in_scheduling() -> None:
    static, iterative = (read_config(MODEL_REPOSITORY / m) for m in MODELS)
    for config in (static, iterative):
        assert config.backend == "python" and config.max_batch_size == 8
        assert config.model_transaction_policy.decoupled
    assert [(t.name, t.data_type) for t in static.input] == [(t.name, t.data_type) for t in iterative.input]
    assert {t.name for t in static.output} | {"NULLS"} == {t.name for t in iterative.output}
    assert dict(static.parameters) == dict(iterative.parameters)
    assert static.HasField("dynamic_batching") and not static.HasField("sequence_batching")
    seq = iterative.sequence_batching
    assert seq.iterative_sequence and seq.HasField("direct")
    kinds = [c.control[0].kind for c in seq.control_input]
    assert kinds == [mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY]
