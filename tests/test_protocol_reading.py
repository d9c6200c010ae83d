"""lessons/protocol_reading.py: notebook 01's printed readings, and its re-measurement run for real.

The readings are pure functions of a table or an exchange; the re-measurement (which the notebook
runs only when its timing claim missed) is forced here against a real ``echo``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from lab_backends.client.protocol import HttpExchange
from lab_backends.lessons import protocol_reading
from lab_backends.notebook import check_measured


def _exchange(body: dict) -> HttpExchange:
    return HttpExchange("POST", "/v2/models/m/infer", {"Content-Type": "application/json"}, json.dumps(body).encode(),
                        200, {}, b"{}", 1.0)


def test_json_number_chars_counts_the_text_of_each_number() -> None:
    values = [[0.5, -0.30486962199211121, 12.0]]
    counts = protocol_reading.json_number_chars(_exchange(
        {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": values}]}))
    texts = [json.dumps(v) for v in values[0]]
    assert counts == {"values": 3, "min_chars": 3, "max_chars": max(map(len, texts)),
                      "json_chars": sum(map(len, texts)) + 2, "raw_bytes": 12}
    line = protocol_reading.json_number_line(_exchange(
        {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [0.0, 0.0]}]}))
    assert "7 characters on 2 numbers (3-3 each" in line and "take 8" in line


def test_latency_lines_read_the_table() -> None:
    rows = [("small", "REST, JSON tensors", 0.4), ("small", "REST, binary tensors", 0.3),
            ("small", "gRPC (protobuf, raw bytes)", 0.6), ("large", "REST, JSON tensors", 90.0),
            ("large", "REST, binary tensors", 2.0), ("large", "gRPC (protobuf, raw bytes)", 4.0)]
    table = pd.DataFrame(rows, columns=["tensor", "variant", "p50_ms"]).set_index(["tensor", "variant"])
    lines = protocol_reading.latency_lines(table)
    assert lines[0] == ("small tensor: p50 from 0.30 ms (REST, binary tensors) to 0.60 ms "
                        "(gRPC (protobuf, raw bytes)), a spread of 0.30 ms")
    assert "REST, JSON tensors p50 90.00 ms = 45.0x binary REST's" in lines[1]
    assert "gRPC (protobuf, raw bytes) p50 4.00 ms = 2.0x binary REST's" in lines[2]
    assert "REST, JSON tensors: the large tensor's p50 is 225x the small one's" in lines


@pytest.mark.server
def test_the_remeasure_of_the_binary_claim_runs_when_forced(start_server, capsys) -> None:
    """Notebook 01's check_measured re-measures only after a miss: force the miss, run the real re-measurement."""
    server = start_server(models=["echo"], target="local")
    missed = pd.DataFrame({"p50_ms": [1.0, 2.0]}, index=["REST, JSON tensors", "REST, binary tensors"])
    again = check_measured("binary tensors make the large request faster", missed,
                           lambda t: t.loc["REST, binary tensors", "p50_ms"] / t.loc["REST, JSON tensors", "p50_ms"],
                           below=1, remeasure=protocol_reading.large_again(server, 1 << 14, repeats=2))
    assert "re-measuring once" in capsys.readouterr().out
    assert list(again.index) == ["REST, JSON tensors", "REST, binary tensors", "gRPC (protobuf, raw bytes)"]
    assert (again["requests"] == 4).all(), "REPEATS x the re-measure factor"
    assert np.isfinite(again["p50_ms"]).all()
