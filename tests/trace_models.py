"""Test-only models for tracing: an ensemble and a BLS model, both over the real ``cost_model``.

They let the trace tests (and the recorder of ``tests/data/traces``) see parent/child traces without
depending on the digits models. Configs are built with Triton's own protobuf schema.
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as pb

from lab_backends.server.repository import ModelConfig, config_text

ENSEMBLE = "trace_ensemble"
BLS = "trace_bls"

_BLS_CODE = '''\
"""BLS over cost_model; the child request carries the parent's trace so that it shows up in the file."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            child = pb_utils.InferenceRequest(
                model_name="cost_model",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x)],
                trace=request.trace(),
            ).exec()
            if child.has_error():
                responses.append(pb_utils.InferenceResponse(error=child.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(child, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)]))
        return responses
'''


def _io(config: ModelConfig) -> None:
    config.max_batch_size = 64
    config.input.add(name="INPUT0", data_type=pb.TYPE_FP32, dims=[16])
    config.output.add(name="OUTPUT0", data_type=pb.TYPE_FP32, dims=[16])


def write_trace_models(repo: Path) -> Path:
    """Write ``trace_ensemble`` (cost_model twice) and ``trace_bls`` into ``repo``; serve with cost_model."""
    repo = Path(repo)
    ens = ModelConfig(name=ENSEMBLE, platform="ensemble")
    _io(ens)
    first = ens.ensemble_scheduling.step.add(model_name="cost_model", model_version=-1)
    first.input_map["INPUT0"] = "INPUT0"
    first.output_map["OUTPUT0"] = "middle"
    second = ens.ensemble_scheduling.step.add(model_name="cost_model", model_version=-1)
    second.input_map["INPUT0"] = "middle"
    second.output_map["OUTPUT0"] = "OUTPUT0"
    (repo / ENSEMBLE / "1").mkdir(parents=True, exist_ok=True)
    (repo / ENSEMBLE / "config.pbtxt").write_text(config_text(ens))

    bls = ModelConfig(name=BLS, backend="python")
    _io(bls)
    bls.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=1)
    (repo / BLS / "1").mkdir(parents=True, exist_ok=True)
    (repo / BLS / "config.pbtxt").write_text(config_text(bls))
    (repo / BLS / "1" / "model.py").write_text(_BLS_CODE)
    return repo


CACHED = "trace_cached"


def write_cached_model(repo: Path, source: Path) -> Path:
    """A copy of ``cost_model`` (from ``source``) named ``trace_cached`` with the response cache on."""
    from lab_backends.server.repository import read_config

    repo = Path(repo)
    config = read_config(source)
    config.name = CACHED
    config.response_cache.enable = True
    (repo / CACHED / "1").mkdir(parents=True, exist_ok=True)
    (repo / CACHED / "config.pbtxt").write_text(config_text(config))
    (repo / CACHED / "1" / "model.py").write_text((source / "1" / "model.py").read_text())
    return repo
