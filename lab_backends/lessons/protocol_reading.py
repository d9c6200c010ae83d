"""Notebook 01's readings: what this run's bytes and timings say, as printed sentences.

Every comparative sentence notebook 01 prints about sizes and latencies comes from here, computed
from the measurement it describes, so a run that measures otherwise also says otherwise (no prose
claim a run can contradict). Shared memory's own reading is
:func:`lab_backends.lessons.shared_memory.latency_lines`.
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np
import pandas as pd

from lab_backends.client.latency import compare_latency
from lab_backends.client.protocol import HttpExchange
from lab_backends.server.running import RunningServer


def _flat(data: object) -> list:
    if isinstance(data, list):
        return [v for item in data for v in _flat(item)]
    return [data]


def json_number_chars(exchange: HttpExchange, name: str = "INPUT0") -> dict[str, int]:
    """How many characters the JSON body of ``exchange`` spends on input ``name``'s numbers.

    The body was written by :func:`json.dumps`, so each number's text is ``json.dumps`` of the
    value read back. ``raw_bytes`` is what the same values take as raw little-endian bytes.
    """
    entry = next(i for i in exchange.request_json["inputs"] if i["name"] == name)
    texts = [json.dumps(v) for v in _flat(entry["data"])]
    itemsize = np.dtype({"FP32": np.float32, "FP64": np.float64, "INT32": np.int32,
                         "INT64": np.int64}.get(entry["datatype"], np.float32)).itemsize
    return {"values": len(texts), "min_chars": min(map(len, texts)), "max_chars": max(map(len, texts)),
            "json_chars": sum(map(len, texts)) + len(texts) - 1, "raw_bytes": itemsize * len(texts)}


def json_number_line(exchange: HttpExchange, name: str = "INPUT0") -> str:
    counts = json_number_chars(exchange, name)
    return (f"the JSON body spent {counts['json_chars']} characters on {counts['values']} numbers "
            f"({counts['min_chars']}-{counts['max_chars']} each, commas included in the total); "
            f"as raw bytes they take {counts['raw_bytes']}")


def latency_lines(latency: pd.DataFrame) -> list[str]:
    """The small and large tensors of section 4, read: spreads and ratios of the p50 column.

    ``latency``: the notebook's table, indexed by (tensor, variant) with ``small`` and ``large``.
    """
    small, large = latency.loc["small", "p50_ms"], latency.loc["large", "p50_ms"]
    binary = "REST, binary tensors"
    lines = [f"small tensor: p50 from {small.min():.2f} ms ({small.idxmin()}) to {small.max():.2f} ms "
             f"({small.idxmax()}), a spread of {small.max() - small.min():.2f} ms"]
    lines += [f"large tensor: {way} p50 {large[way]:.2f} ms = {large[way] / large[binary]:.1f}x binary REST's"
              for way in large.index if way != binary]
    lines += [f"{way}: the large tensor's p50 is {large[way] / small[way]:.0f}x the small one's" for way in large.index]
    return lines


def large_again(server: RunningServer, n: int, repeats: int, model: str = "echo",
                seed: int = 0) -> Callable[[float], pd.DataFrame]:
    """Section 4's large tensor timed again with ``factor`` times the repeats: the claim's ``remeasure``.

    It runs only when the first measurement missed, so it is a function here, where a test can run it.
    """
    def again(factor: float) -> pd.DataFrame:
        tensor = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
        return compare_latency(server, model, {"INPUT0": tensor}, repeats=max(1, int(repeats * factor)))

    return again
