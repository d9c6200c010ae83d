"""Change a served model's config: derive a new one from the config in force, and reload with it.

Triton's load API takes a config *override*, and an override **replaces the whole config** (a
partial one would silently drop inputs, batching, parameters...). So every change is derived from
the config the server is using now: :func:`derive_config` copies it and changes only what is named
(fields of a dict, or whatever a function edits), and :func:`apply_config` reloads the model with
the result. The one way to change a live model's config, for the lessons, sweeps and exercises.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Union

from google.protobuf import json_format

from lab_backends.errors import LoadSettingError, ModelLoadError
from lab_backends.server.repository import ModelConfig
from lab_backends.server.running import RunningServer

#: An override: field -> new value (JSON form, ``None`` removes the field), a function of the
#: current config, a complete ``ModelConfig``, or ``None`` for "as it is".
Override = Union[None, Mapping[str, Any], Callable[[ModelConfig], ModelConfig], ModelConfig]

def derive_config(base: ModelConfig, override: Override) -> ModelConfig:
    """A new config: ``base`` with the override's fields replaced (maps such as ``parameters`` merged).

    ``{"dynamic_batching": {"max_queue_delay_microseconds": 2000}}`` replaces the whole
    ``dynamic_batching`` message; ``{"parameters": {"fixed_ms": {"string_value": "5"}}}`` changes
    one parameter and keeps the others; ``{"dynamic_batching": None}`` turns batching off.
    """
    config = ModelConfig()
    config.CopyFrom(base)
    if override is None:
        return config
    if isinstance(override, ModelConfig):
        config.CopyFrom(override)
        return config
    if callable(override):
        result = override(config)
        return result if result is not None else config
    if not isinstance(override, Mapping):
        raise LoadSettingError(
            f"a config override must be a dict, a function or a ModelConfig, not {type(override).__name__}"
        )
    fields = ModelConfig.DESCRIPTOR.fields_by_name
    for key, value in override.items():
        if key not in fields:
            raise LoadSettingError(
                f"'{key}' is not a model config field; see model_config.proto (e.g. dynamic_batching, "
                "instance_group, max_batch_size, parameters)"
            )
        field = fields[key]
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if value is None:
            config.ClearField(key)
            continue
        parsed = ModelConfig()
        try:
            json_format.ParseDict({key: value}, parsed)
        except json_format.ParseError as exc:
            raise LoadSettingError(f"bad value for config field '{key}': {exc}") from exc
        if is_map:
            target = getattr(config, key)
            for map_key, map_value in value.items():
                if map_value is None:
                    target.pop(map_key, None)
                elif field.message_type.fields_by_name["value"].message_type is not None:
                    target[map_key].CopyFrom(getattr(parsed, key)[map_key])
                else:
                    target[map_key] = getattr(parsed, key)[map_key]
        else:
            config.ClearField(key)
            config.MergeFrom(parsed)
    return config


def apply_config(server: RunningServer, model: str, override: Override, base: ModelConfig | None = None) -> ModelConfig:
    """Reload ``model`` with ``override`` applied to ``base`` (default: the config now live)."""
    base = base if base is not None else server.model_config(model)
    config = derive_config(base, override)
    try:
        server.load_model(model, config=config)  # a refusal raises ModelLoadError quoting Triton's log
    except ModelLoadError as exc:
        raise ModelLoadError(
            model, exc.reason,
            hint="change the setting; the model keeps serving its previous config until a load succeeds",
        ) from exc
    return config
