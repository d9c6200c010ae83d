"""Sweeps: reload a model with each config override, load it at each concurrency, one tidy frame.

Triton's load API takes a config *override*, and an override **replaces the whole config** (a
partial one would silently drop inputs, batching, parameters...). So every override here is derived
from the config the server is using now: :func:`derive_config` copies it and changes only the
fields named. Models are reloaded through explicit model control (the server's admin key is passed
for you), and the config that was live before the sweep is put back afterwards.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

import pandas as pd
from google.protobuf import json_format

from lab_backends.errors import LoadSettingError, ModelLoadError
from lab_backends.measure.loadgen import run_closed, run_open
from lab_backends.server.repository import ModelConfig
from lab_backends.server.running import RunningServer

#: An override: field -> new value (JSON form, ``None`` removes the field), a function of the
#: current config, a complete ``ModelConfig``, or ``None`` for "as it is".
Override = Union[None, Mapping[str, Any], Callable[[ModelConfig], ModelConfig], ModelConfig]

#: Ready-made overrides for the batching lessons.
NO_BATCHING: dict[str, Any] = {"dynamic_batching": None}
DYNAMIC_BATCHING: dict[str, Any] = {"dynamic_batching": {}}


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


def sweep(
    server: RunningServer,
    model: str,
    concurrency: Sequence[int] = (1, 4, 16),
    configs: Mapping[str, Override] | None = None,
    *,
    protocol: str = "grpc",
    mode: str = "closed",
    rates: Sequence[float] | None = None,
    requests: int = 300,
    duration_s: float = 5.0,
    warmup_requests: int | None = None,
    inputs: Mapping[str, Any] | None = None,
    metrics: bool = False,
    restore: bool = True,
    progress: bool = True,
) -> pd.DataFrame:
    """Every config x every concurrency (or open-loop rate): one row each, server view included.

    Columns: ``config``, ``model``, ``protocol``, ``mode``, ``concurrency``, ``rate_rps``,
    ``requests``, ``throughput_rps``, ``p50_ms`` ... ``p99_ms``, ``errors``, ``avg_batch``,
    ``server_queue_ms``, ``server_compute_*_ms`` and ``batch_hist`` (a dict: size -> executions).
    ``configs`` maps a name to an override (see :func:`derive_config`); default: the live config.
    """
    from tqdm.auto import tqdm

    if mode not in ("closed", "open"):
        raise LoadSettingError(f"mode must be 'closed' or 'open', not {mode!r}")
    points: Sequence[float] = list(rates or []) if mode == "open" else list(concurrency)
    if not points:
        raise LoadSettingError("nothing to sweep: give concurrency=[...] (closed) or rates=[...] (open)")
    configs = dict(configs) if configs else {"current": None}
    base = server.model_config(model)
    rows = []
    bar = tqdm(total=len(configs) * len(points), desc=f"sweep {model}", disable=not progress)
    try:
        for name, override in configs.items():
            bar.set_postfix_str(f"loading {name}")
            if override is not None or len(configs) > 1:
                apply_config(server, model, override, base)
            for point in points:
                bar.set_postfix_str(f"{name} @ {point}")
                common = dict(
                    protocol=protocol, inputs=inputs, requests=requests, duration_s=duration_s,
                    warmup_requests=warmup_requests, metrics=metrics,
                )
                if mode == "closed":
                    result = run_closed(server, model, int(point), **common)
                else:
                    result = run_open(server, model, float(point), **common)
                rows.append({"config": name, **result.row()})
                bar.update(1)
    finally:
        bar.close()
        if restore and (len(configs) > 1 or any(o is not None for o in configs.values())):
            server.load_model(model, config=base)
    return pd.DataFrame(rows)
