"""The Python-based backend ``sklearn``: two models served through ``backend: "sklearn"``.

Neither model folder holds code; ``backends/sklearn/model.py`` is installed once in the backend
directory and Triton runs it for both. A third, misconfigured model shows that the backend's
own checks reach the user as a load failure with a reason.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from lab_backends.client.infer import infer
from lab_backends.digits import build, build_models, normalize
from lab_backends.digits.classic import CLASSIC_MODELS, predict_proba
from lab_backends.paths import BACKEND_DIR, MODEL_REPOSITORY
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    build_models()
    extra = tmp_path_factory.mktemp("repo")
    bad = extra / "digits_bad_sklearn"
    (bad / "1").mkdir(parents=True)
    shutil.copy(MODEL_REPOSITORY / "digits_logreg" / "1" / "model.pkl", bad / "1" / "model.pkl")
    config = read_config(MODEL_REPOSITORY / "digits_logreg")
    config.name = bad.name
    config.output[0].name = "SCORES"  # not an output the backend knows how to produce
    (bad / "config.pbtxt").write_text(config_text(config))
    models = [*CLASSIC_MODELS, bad.name]
    with TritonServer([MODEL_REPOSITORY, extra], models=models, allow_broken_models=True, startup_timeout_s=240) as srv:
        yield srv


def test_backend_is_installed_and_models_hold_no_code():
    assert (BACKEND_DIR / "sklearn" / "model.py").read_bytes() == (
        build.BACKENDS_SOURCE / "sklearn" / "model.py"
    ).read_bytes()
    for name in CLASSIC_MODELS:
        assert read_config(MODEL_REPOSITORY / name).backend == "sklearn"
        assert not list((MODEL_REPOSITORY / name).rglob("model.py"))


@pytest.mark.parametrize("name", CLASSIC_MODELS)
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_served_probabilities_match_scikit_learn(server, split, name, protocol):
    assert name not in server.broken_models, server.broken_models.get(name)
    pixels = normalize(split.test_images)
    want = predict_proba(MODEL_REPOSITORY / name / "1" / "model.pkl", pixels)
    probs, labels = [], []
    for i in range(0, len(pixels), 64):
        out = infer(server, name, {"PIXELS": pixels[i : i + 64]}, protocol=protocol)
        probs.append(out["PROBABILITIES"])
        labels.append(out["LABEL"])
    probs, labels = np.concatenate(probs), np.concatenate(labels)
    np.testing.assert_allclose(probs, want, rtol=0, atol=1e-6)
    assert labels.dtype == np.int64 and labels.shape == (len(pixels), 1)
    np.testing.assert_array_equal(labels[:, 0], want.argmax(1))
    assert (labels[:, 0] == split.test_labels).mean() >= 0.95


def test_concurrent_requests_are_batched_and_split_back(server, split):
    pixels = normalize(split.test_images)
    want = predict_proba(MODEL_REPOSITORY / "digits_logreg" / "1" / "model.pkl", pixels)

    def client_run(offset):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            for i in range(offset, offset + 80, 8):
                rows = slice(i, i + 1 + (i % 3))
                out = infer(server, "digits_logreg", {"PIXELS": pixels[rows]}, client=client)
                np.testing.assert_allclose(out["PROBABILITIES"], want[rows], rtol=0, atol=1e-6)
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client_run, range(0, 8 * 30, 30)))
    stats = server.statistics("digits_logreg")["model_stats"][0]
    assert int(stats["execution_count"]) < int(stats["inference_count"])


def test_backend_checks_reach_the_user(server):
    reason = server.broken_models.get("digits_bad_sklearn", "")
    assert "cannot produce outputs ['SCORES']" in reason, server.broken_models
    assert infer(server, "digits_logreg", {"PIXELS": np.zeros((1, 64), np.float32)})["LABEL"].shape == (1, 1)
