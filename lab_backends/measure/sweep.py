"""Sweeps: reload a model with each config override, load it at each concurrency, one tidy frame.

Triton's load API takes a config *override*, and an override **replaces the whole config** (a
partial one would silently drop inputs, batching, parameters...). So every override here is derived
from the config the server is using now (:mod:`lab_backends.server.config_changes`). Models are
reloaded through explicit model control (the server's admin key is passed
for you), and the config that was live before the sweep is put back afterwards.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

from lab_backends.errors import LoadSettingError
from lab_backends.measure.loadgen import run_closed, run_open
from lab_backends.server.config_changes import Override, apply_config
from lab_backends.server.running import RunningServer

#: Ready-made overrides for the batching lessons.
NO_BATCHING: dict[str, Any] = {"dynamic_batching": None}
DYNAMIC_BATCHING: dict[str, Any] = {"dynamic_batching": {}}


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
    ``configs`` maps a name to an override (see
    :func:`~lab_backends.server.config_changes.derive_config`); default: the live config.
    """
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
