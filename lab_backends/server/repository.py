"""Model repositories and model configs, through Triton's own protobuf schema.

Configs are read and written with ``tritonclient.grpc.model_config_pb2`` and
``google.protobuf.text_format`` so that a typo is caught with a line and column, the way Triton
itself would reject it, instead of by string templates that drift from the schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from lab_backends.errors import ModelConfigError

ModelConfig = model_config_pb2.ModelConfig


def parse_config(text: str, source: str = "<config>") -> ModelConfig:
    """Parse ``config.pbtxt`` text; raise :class:`ModelConfigError` naming the line and column."""
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(
            f"{source} is not a valid Triton model config: {exc}. Compare it with "
            "https://github.com/triton-inference-server/common/blob/r24.10/protobuf/model_config.proto"
        ) from exc


def read_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.pbtxt"
    return parse_config(path.read_text(), str(path))


def config_text(config: ModelConfig) -> str:
    """Canonical ``config.pbtxt`` text for a config."""
    return text_format.MessageToString(config)


def config_json(config: ModelConfig) -> str:
    """The JSON form that Triton's load API accepts as a config override."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


def config_from_json(payload: dict) -> ModelConfig:
    """Turn the server's JSON config (``/v2/models/<m>/config``) back into the protobuf."""
    return json_format.ParseDict(payload, ModelConfig(), ignore_unknown_fields=True)


def model_dirs(repositories: Iterable[Path]) -> dict[str, Path]:
    """Model name -> folder for every model folder (one holding ``config.pbtxt``) in the repositories."""
    found: dict[str, Path] = {}
    for repo in repositories:
        for child in sorted(Path(repo).iterdir()):
            if child.is_dir() and (child / "config.pbtxt").exists():
                found.setdefault(child.name, child)
    return found


def config_problem(model_dir: Path) -> str | None:
    """Our own parse of a model's config: the line/column detail that Triton's log leaves out."""
    try:
        read_config(model_dir)
    except ModelConfigError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {model_dir / 'config.pbtxt'}: {exc}"
    return None


def missing_model_file(model_dir: Path) -> str | None:
    """Why a Python model folder cannot load for lack of its code, or ``None`` if it can.

    Measured on 2.51: a Python model whose ``<version>/model.py`` is missing does not fail; its
    stub exits ("Failed to preinitialize Python stub: Python model file not found") and the load
    stays LOADING forever, so the server never becomes ready. Checking the files first turns a
    silent hang into an error that names the missing file.
    """
    try:
        config = read_config(model_dir)
    except ModelConfigError:
        return None  # a config that does not parse is Triton's to report, with its own reason
    if config.backend != "python":
        return None
    filename = config.default_model_filename or "model.py"
    versions = sorted(
        (p for p in Path(model_dir).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    if not versions:
        return f"{model_dir} has no numeric version folder (e.g. {model_dir / '1' / filename})"
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy == "all":
        served = versions
    elif policy == "specific":
        wanted_numbers = set(config.version_policy.specific.versions)
        served = [v for v in versions if int(v.name) in wanted_numbers]
    else:  # the default: the latest one (or latest N)
        served = versions[-max(config.version_policy.latest.num_versions, 1):]
    missing = [v / filename for v in served if not (v / filename).is_file()]
    if missing:
        return (
            f"Python model file not found: {', '.join(map(str, missing))}. Triton 2.51 would wait for "
            f"this model forever (it stays LOADING); add {filename} there or remove the model folder"
        )
    return None


def preflight(repositories: Iterable[str | Path], models: Iterable[str] | None = None) -> dict[str, str]:
    """``{model: reason}`` for models that would hang Triton's load instead of failing it."""
    found = model_dirs(Path(r) for r in repositories)
    wanted = list(models) if models is not None else sorted(found)
    problems = {}
    for name in wanted:
        if name in found:
            reason = missing_model_file(found[name])
            if reason:
                problems[name] = reason
    return problems
