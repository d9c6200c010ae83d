"""digits_tf: the trained PyTorch weights exported to a TensorFlow SavedModel, checked offline.

TensorFlow runs in a child process (one for the module): importing it takes seconds and ~700 MB,
which the rest of the suite, sharing this pytest process, should not carry. The child loads the
SavedModel that ``lab-backends build-models`` wrote, runs the held-out digits through its serving
signature with one thread, and reports the logits and the signature's tensor names, shapes and types.
The served model (Triton, the Python backend) is checked in tests/test_frameworks.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from lab_backends.digits import build, load_split, normalize
from lab_backends.digits.reference import torch_logits
from lab_backends.server.repository import read_config

_CHILD = r"""
import json, sys
import numpy as np
from lab_backends.digits import export_tf
from lab_backends.digits.reference import tf_logits
pixels = np.load(sys.argv[1])
tf = export_tf.import_tensorflow()
serve = tf.saved_model.load(sys.argv[2]).signatures[export_tf.SIGNATURE]
_, inputs = serve.structured_input_signature
spec = lambda s: {"shape": list(s.shape.as_list()), "dtype": s.dtype.name}
np.save(sys.argv[3], tf_logits(pixels, sys.argv[2]))
print(json.dumps({"inputs": {k: spec(v) for k, v in inputs.items()},
                  "outputs": {k: spec(v) for k, v in serve.structured_outputs.items()},
                  "intra": tf.config.threading.get_intra_op_parallelism_threads(),
                  "inter": tf.config.threading.get_inter_op_parallelism_threads()}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    build.build_models()
    tmp = tmp_path_factory.mktemp("tf")
    pixels = normalize(load_split().test_images)
    np.save(tmp / "pixels.npy", pixels)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp / "pixels.npy"),
                           str(build.ARTIFACT_DIR / "model.savedmodel"), str(tmp / "logits.npy")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "oneDNN" not in done.stderr, "TensorFlow's start-up notice is back: see export_tf.QUIET_ENV"
    return pixels, np.load(tmp / "logits.npy"), json.loads(done.stdout.strip().splitlines()[-1])


def test_savedmodel_matches_pytorch_within_1e5_on_every_held_out_digit(exported):
    pixels, from_tf, _ = exported
    from_torch = torch_logits(pixels)
    assert from_tf.shape == from_torch.shape == (len(pixels), 10) and from_tf.dtype == np.float32
    assert np.abs(from_tf - from_torch).max() < 1e-5
    assert (from_tf.argmax(1) == from_torch.argmax(1)).all()


def test_savedmodel_signature_is_the_interface_and_threads_are_pinned(exported):
    _, _, info = exported
    assert info["inputs"] == {"PIXELS": {"shape": [None, 64], "dtype": "float32"}}
    assert info["outputs"] == {"LOGITS": {"shape": [None, 10], "dtype": "float32"}}
    assert (info["intra"], info["inter"]) == (1, 1)


def test_native_tensorflow_config_matches_the_signature(exported):
    """model_repository_gpu/digits_tf_gpu: the config's names, types and dims are the signature's."""
    _, _, info = exported
    config = read_config(build.GPU_REPOSITORY / "digits_tf_gpu")
    assert config.platform == "tensorflow_savedmodel" and config.default_model_filename == "model.savedmodel"
    assert (build.GPU_REPOSITORY / "digits_tf_gpu" / "1" / "model.savedmodel" / "saved_model.pb").is_file()
    for tensors, side in ((config.input, "inputs"), (config.output, "outputs")):
        assert {t.name: [-1, *t.dims] for t in tensors} == {
            name: [-1 if d is None else d for d in spec["shape"]] for name, spec in info[side].items()}
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params == {"TF_NUM_INTRA_THREADS": "1", "TF_NUM_INTER_THREADS": "1"}
