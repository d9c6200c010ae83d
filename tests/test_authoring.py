"""lab_backends.lessons.authoring: model folders written from source text, served by a real Triton.

The unit tests pin the config that is written; the integration tests load the written models into
one real server (explicit mode, nothing loaded at start) and check what notebook 04 teaches:
auto-complete, reload of edited code, gather/scatter, an error per response vs a raise, and
custom metrics on the Prometheus page.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from lab_backends.client.infer import infer
from lab_backends.errors import ModelConfigError
from lab_backends.lessons import authoring, management
from lab_backends.lessons.authoring import Tensor
from lab_backends.server.repository import parse_config

# --------------------------------------------------------------------------------------------- unit


def test_python_config_is_built_from_the_schema():
    config = authoring.python_config(
        "m", [Tensor("IMAGE", "UINT8", [8, 8])], [Tensor("LABEL", "BYTES", [1])],
        max_batch_size=16, dynamic_batching=True, max_queue_delay_us=100, instances=2, parameters={"k": 3},
    )
    again = parse_config(authoring.config_text(config))  # what is written parses back unchanged
    assert again == config
    assert config.backend == "python" and config.max_batch_size == 16
    assert config.input[0].data_type == model_config_pb2.TYPE_UINT8 and list(config.input[0].dims) == [8, 8]
    assert config.output[0].data_type == model_config_pb2.TYPE_STRING  # BYTES on the wire
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert config.instance_group[0].count == 2 and config.parameters["k"].string_value == "3"
    plain = authoring.python_config("p", dynamic_batching=True)
    assert plain.HasField("dynamic_batching")  # present even with every field at its default


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"inputs": [Tensor("X", "FLOAT", [1])]}, "unknown data type"),
        ({"max_batch_size": -1}, "max_batch_size"),
        ({"max_queue_delay_us": 10}, "dynamic_batching"),
    ],
)
def test_python_config_refuses_bad_settings(kwargs, words):
    with pytest.raises(ModelConfigError, match=words):
        authoring.python_config("m", **kwargs)


@pytest.mark.parametrize(
    "source, words",
    [
        ("class TritonPythonModel:\n    def execute(self, requests)\n", "does not parse: line 2"),
        ("class Model:\n    def execute(self, requests):\n        return []\n", "no class TritonPythonModel"),
        ("class TritonPythonModel:\n    def initialize(self, args):\n        pass\n", "no execute"),
    ],
)
def test_write_model_refuses_source_that_cannot_serve(tmp_path, source, words):
    with pytest.raises(ModelConfigError, match=words):
        authoring.write_model(tmp_path, source, authoring.bare_config("m"))
    assert not (tmp_path / "m").exists()


def test_write_model_layout(tmp_path):
    source = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    model_dir = authoring.write_model(tmp_path, source, authoring.bare_config("m"), versions=(1, 3))
    # Each model.py comes with its cache, where a stub's import looks (so its first load writes nothing).
    cached = [str(Path(importlib.util.cache_from_source(str(model_dir / v / "model.py"))).relative_to(tmp_path))
              for v in ("1", "3")]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted([
        "m/1/model.py", "m/3/model.py", "m/config.pbtxt", *cached])
    assert authoring.written_config(model_dir) == authoring.bare_config("m")
    with pytest.raises(ModelConfigError, match="positive"):
        authoring.write_model(tmp_path, source, authoring.bare_config("m"), versions=(0,))
    with pytest.raises(ModelConfigError, match="needs a name"):
        authoring.write_model(tmp_path, source, authoring.ModelConfig(backend="python"))


# ------------------------------------------------------------------------------------- integration

COUNTER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(8)
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [2]})
        return config

    def initialize(self, args):
        self.factor = FACTOR
        pb_utils.Logger.log_info(f"initialize-{args['model_name']}")

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * self.factor).astype(np.float32))]))
        return out

    def finalize(self):
        pb_utils.Logger.log_info("finalize-auto")
'''

BATCHED = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.mode = json.loads(args["model_config"])["parameters"]["mode"]["string_value"]
        self.family = pb_utils.MetricFamily(
            name="test_refused_total", description="refused", kind=pb_utils.MetricFamily.COUNTER)
        self.refused = self.family.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        parts = np.split(np.concatenate(xs) + 1.0, np.cumsum([len(x) for x in xs])[:-1])
        out = []
        for x, part in zip(xs, parts):
            if (x < 0).any():
                if self.mode == "raise":
                    raise ValueError("negative X")
                self.refused.increment(1)
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative X")))
                continue
            n = np.full((len(part), 1), len(requests), np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", part.astype(np.float32)),
                                                   pb_utils.Tensor("N", n)]))
        return out
'''


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One server on a scratch repository with nothing loaded: every test loads what it needs."""
    from lab_backends.server.triton_server import TritonServer

    repo = tmp_path_factory.mktemp("authoring-repo")
    forgetful = BATCHED.replace("self.family = pb_utils", "family = pb_utils").replace(
        "self.family.Metric", "family.Metric")  # the family is a local: freed after initialize
    for name, mode, source in (("batched", "error", BATCHED), ("batched_raising", "raise", BATCHED),
                               ("forgetful", "error", forgetful)):
        config = authoring.python_config(
            name, [Tensor("X", "FP32", [2])], [Tensor("Y", "FP32", [2]), Tensor("N", "INT32", [1])],
            max_batch_size=4, dynamic_batching=True, max_queue_delay_us=500_000, parameters={"mode": mode})
        authoring.write_model(repo, source, config)
    with TritonServer(model_repository=[repo], models=[]) as server:
        yield server, repo


def test_auto_complete_reload_and_lifecycle(lab):
    server, repo = lab
    authoring.write_model(repo, COUNTER.replace("FACTOR", "2.0"), authoring.bare_config("auto"))
    server.load_model("auto")
    completed = server.model_config("auto")
    assert completed.max_batch_size == 8 and [t.name for t in completed.input] == ["X"]
    x = np.array([[1, 2]], np.float32)
    assert np.array_equal(infer(server, "auto", {"X": x})["Y"], 2 * x)
    assert authoring.wait_for_log(server, "initialize-auto")
    authoring.write_model(repo, COUNTER.replace("FACTOR", "5.0"), authoring.bare_config("auto"))
    server.load_model("auto")  # the files changed: Triton reloads the new code
    assert np.array_equal(infer(server, "auto", {"X": x})["Y"], 5 * x)
    server.unload_model("auto")
    management.wait_until_unloaded(server, "auto")
    assert authoring.wait_for_log(server, "finalize-auto")


def test_batch_gather_scatter_errors_and_metrics(lab):
    server, _ = lab
    for name in ("batched", "batched_raising", "forgetful"):
        server.load_model(name)
    good = [{"X": np.full((n, 2), i, np.float32)} for i, n in enumerate((1, 2, 1))]
    replies = authoring.send_together(server, "batched", good)
    assert [int(r["N"][0, 0]) for r in replies] == [3, 3, 3]  # one execute() for all three
    assert all(np.array_equal(r["Y"], q["X"] + 1) for r, q in zip(replies, good))

    bad = [good[0], {"X": -np.ones((2, 2), np.float32)}, good[2]]
    careful = authoring.send_together(server, "batched", bad)
    assert isinstance(careful[0], dict) and isinstance(careful[2], dict)
    assert "negative X" in careful[1].message()
    raising = authoring.send_together(server, "batched_raising", bad)
    assert all(isinstance(r, Exception) and "negative X" in r.message() for r in raising)

    assert authoring.metric_value(server, "test_refused_total", model="batched") == 1
    assert authoring.metric_value(server, "test_refused_total", model="batched_raising") == 0
    assert authoring.metric_value(server, "test_refused_total", model="nonexistent") is None

    # A family not kept alive on self: the request is still refused, but no series ever shows.
    assert isinstance(authoring.send_together(server, "forgetful", bad[1:2])[0], Exception)
    assert authoring.metric_value(server, "test_refused_total", model="forgetful") is None

    # Measured on 2.51: a kept series outlives an unload, and a reload continues counting from it.
    server.unload_model("batched")
    management.wait_until_unloaded(server, "batched")
    assert authoring.metric_value(server, "test_refused_total", model="batched") == 1
    server.load_model("batched")
    authoring.send_together(server, "batched", bad[1:2])
    assert authoring.metric_value(server, "test_refused_total", model="batched") == 2


def test_send_together_times_out_with_a_reason(lab):
    server, repo = lab
    slow = (
        "import time\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n\n"
        "class TritonPythonModel:\n    def execute(self, requests):\n        time.sleep(3)\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', np.zeros((1, 1), np.float32))]) "
        "for _ in requests]\n"
    )
    config = authoring.python_config("slow", [Tensor("X", "FP32", [1])], [Tensor("Y", "FP32", [1])], max_batch_size=1)
    authoring.write_model(repo, slow, config)
    server.load_model("slow")
    with pytest.raises(TimeoutError, match="got no answer"):
        authoring.send_together(server, "slow", [{"X": np.zeros((1, 1), np.float32)}], timeout_s=0.5)
    server.unload_model("slow")


# ---------------------------------------------------------------------------------------- exercise


