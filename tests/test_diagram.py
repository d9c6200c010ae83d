"""lab_backends.lessons.diagram: the scheduler/backend each config selects, and the figure that shows it."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from lab_backends.lessons import diagram
from lab_backends.paths import MODEL_REPOSITORY, PROJECT_ROOT
from lab_backends.server.repository import ModelConfig, parse_config, read_config

#: The Python-based backends this project ships (``backends/<name>/model.py``), as a backend dir.
SOURCE_BACKENDS = PROJECT_ROOT / "backends"


def test_scheduler_follows_the_config() -> None:
    assert diagram.scheduler_of(parse_config('name: "a" backend: "python"')) == "default"
    assert diagram.scheduler_of(parse_config('name: "a" backend: "python" dynamic_batching { }')) == "dynamic batcher"
    assert diagram.scheduler_of(parse_config('name: "a" backend: "python" sequence_batching { }')) == "sequence batcher"
    assert diagram.scheduler_of(parse_config('name: "a" platform: "ensemble"')) == "ensemble"


def test_backend_boxes() -> None:
    assert diagram.backend_of(ModelConfig(backend="python")) == "python"
    assert diagram.backend_of(ModelConfig(platform="onnxruntime_onnx")) == "onnxruntime (NGC)"
    assert diagram.backend_of(ModelConfig(backend="pytorch")) == "pytorch (NGC)"
    assert diagram.backend_of(ModelConfig(platform="tensorflow_savedmodel")) == "tensorflow (NGC)"
    assert diagram.backend_of(ModelConfig(backend="scale"), backend_dir=None) == "C (custom)"
    assert diagram.backend_of(ModelConfig(platform="ensemble")).startswith("(none")


def test_a_python_based_backend_is_drawn_in_the_python_box(tmp_path: Path) -> None:
    """The live config of a Python-based backend carries runtime "model.py"; from disk, the backend dir decides."""
    assert diagram.backend_of(ModelConfig(backend="sklearn", runtime="model.py")) == "python"
    assert diagram.backend_of(ModelConfig(backend="scale", runtime="libtriton_scale.so")) == "C (custom)"
    (tmp_path / "sklearn").mkdir()
    (tmp_path / "sklearn" / "model.py").write_text("")
    assert diagram.backend_of(ModelConfig(backend="sklearn"), backend_dir=tmp_path) == "python"
    assert diagram.backend_of(ModelConfig(backend="sklearn"), backend_dir=None) == "C (custom)"
    (tmp_path / "sklearn" / "libtriton_sklearn.so").write_bytes(b"")  # the C++ library is tried first
    assert diagram.backend_of(ModelConfig(backend="sklearn"), backend_dir=tmp_path) == "C (custom)"


def test_every_committed_model_lands_in_the_backend_that_runs_it() -> None:
    expected = {"python": "python", "sklearn": "python", "scale": "C (custom)", "digits_prep": "C (custom)",
                "lab_tensorflow": "C (custom)", "lab_libtorch": "C (custom)", "lab_iterative": "C (custom)",
                "lab_executorch": "C (custom)", "lab_kvcache": "C (custom)",
                "ensemble": diagram.NO_BACKEND}
    for folder in sorted(p for p in MODEL_REPOSITORY.iterdir() if (p / "config.pbtxt").is_file()):
        config = read_config(folder)
        named = config.backend or config.platform
        assert diagram.backend_of(config, backend_dir=SOURCE_BACKENDS) == expected[named], folder.name


def test_committed_models_land_where_their_configs_say() -> None:
    configs = {m: read_config(MODEL_REPOSITORY / m) for m in ("cost_model", "echo")}
    table = diagram.placement_table(configs)
    assert table.loc["cost_model", "scheduler"] == "dynamic batcher"
    assert table.loc["echo", "scheduler"] == "default"
    assert (table["backend"] == "python").all()
    assert (table["config names"] == "python").all()


def test_diagram_draws_every_part_and_names_the_models() -> None:
    configs = {m: read_config(MODEL_REPOSITORY / m) for m in ("cost_model", "echo")}
    ax = diagram.architecture_diagram(configs)
    text = "\n".join(t.get_text() for t in ax.texts)
    for part in ("HTTP/REST", "gRPC", "model management", "model repository", *diagram.SCHEDULERS,
                 *diagram.BACKENDS, "response"):
        assert part in text, part
    assert "dynamic batcher\ncost_model" in text and "default\necho" in text
    assert diagram.architecture_diagram() is not None  # no models: the bare map


def test_scheduler_to_backend_arrows_are_the_pairs_the_models_use() -> None:
    """cost_model is batched by the dynamic batcher and runs in the Python backend: no arrow may lead to C."""
    configs = {m: read_config(MODEL_REPOSITORY / m) for m in ("cost_model", "echo")}
    drawn = diagram.drawn_links(diagram.architecture_diagram(configs))
    assert drawn == {"dynamic batcher -> python", "default -> python"}
    configs = {m: read_config(MODEL_REPOSITORY / m)
               for m in ("c_scale", "digits_logreg", "running_mean", "digits_ensemble")}
    drawn = diagram.drawn_links(diagram.architecture_diagram(configs, backend_dir=SOURCE_BACKENDS))
    assert drawn == {"dynamic batcher -> C (custom)", "dynamic batcher -> python", "sequence batcher -> python"}
    assert diagram.drawn_links(diagram.architecture_diagram()) == set()  # the bare map claims no pairing


def test_filled_by_server_lists_what_the_live_config_adds() -> None:
    on_disk = parse_config('name: "a" backend: "python" max_batch_size: 8 dynamic_batching { }')
    live = parse_config('name: "a" backend: "python" max_batch_size: 8 dynamic_batching { preferred_batch_size: 8 } '
                        'version_policy { latest { num_versions: 1 } }')
    assert diagram.filled_by_server(on_disk, live) == {"dynamic_batching.preferred_batch_size": [8],
                                                       "version_policy.latest.num_versions": 1}
    assert diagram.filled_by_server(live, live) == {}
