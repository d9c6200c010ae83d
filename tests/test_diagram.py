"""lab_backends.lessons.diagram: the scheduler/backend each config selects, and the figure that shows it."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from lab_backends.lessons import diagram
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.repository import ModelConfig, parse_config, read_config


def test_scheduler_follows_the_config() -> None:
    assert diagram.scheduler_of(parse_config('name: "a" backend: "python"')) == "default"
    assert diagram.scheduler_of(parse_config('name: "a" backend: "python" dynamic_batching { }')) == "dynamic batcher"
    assert diagram.scheduler_of(parse_config('name: "a" backend: "python" sequence_batching { }')) == "sequence batcher"
    assert diagram.scheduler_of(parse_config('name: "a" platform: "ensemble"')) == "ensemble"


def test_backend_boxes() -> None:
    assert diagram.backend_of(ModelConfig(backend="python")) == "python"
    assert diagram.backend_of(ModelConfig(platform="onnxruntime_onnx")) == "onnxruntime (NGC)"
    assert diagram.backend_of(ModelConfig(backend="pytorch")) == "pytorch (NGC)"
    assert diagram.backend_of(ModelConfig(backend="scale")) == "C (custom)"
    assert diagram.backend_of(ModelConfig(platform="ensemble")).startswith("(none")


def test_committed_models_land_where_their_configs_say() -> None:
    configs = {m: read_config(MODEL_REPOSITORY / m) for m in ("cost_model", "echo")}
    table = diagram.placement_table(configs)
    assert table.loc["cost_model", "scheduler"] == "dynamic batcher"
    assert table.loc["echo", "scheduler"] == "default"
    assert (table["backend"] == "python").all()


def test_diagram_draws_every_part_and_names_the_models() -> None:
    configs = {m: read_config(MODEL_REPOSITORY / m) for m in ("cost_model", "echo")}
    ax = diagram.architecture_diagram(configs)
    text = "\n".join(t.get_text() for t in ax.texts)
    for part in ("HTTP/REST", "gRPC", "model management", "model repository", *diagram.SCHEDULERS,
                 *diagram.BACKENDS, "response"):
        assert part in text, part
    assert "dynamic batcher\ncost_model" in text and "default\necho" in text
    assert diagram.architecture_diagram() is not None  # no models: the bare map
