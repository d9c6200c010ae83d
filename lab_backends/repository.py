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

from .errors import ModelConfigError

ModelConfig = model_config_pb2.ModelConfig


def parse_config(text: str, source: str = "<config>") -> ModelConfig:
    """Parse ``config.pbtxt`` text; raise :class:`ModelConfigError` naming the line and column."""
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(
            f"{source} is not a valid Triton model config: {exc}. Compare it with "
            "https://github.com/triton-inference-server/common/blob/main/protobuf/model_config.proto"
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
