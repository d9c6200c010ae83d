"""The cycle split of the load-generator comparison, on numbers whose answer is known.

The live comparison (every tool against a real server) runs in tests/test_load.py's bench test;
here only the arithmetic, on a hand-made window and on the recorded cost_model window.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from google.protobuf import text_format

from lab_backends.measure import stats
from lab_backends.measure.reference_tools import batch_cycle, cost_parameters
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.repository import ModelConfig

DATA = Path(__file__).resolve().parent / "data" / "stats"


def _window(**changes) -> stats.ServerWindow:
    values = dict(requests=1504, failures=0, inferences=1504, executions=94, avg_batch=16.0, server_ms=16.0,
                  queue_ms=0.7, compute_input_ms=0.25, compute_infer_ms=14.25, compute_output_ms=0.6,
                  batch_hist={16: 94}, batch_infer_ms={16: 14.25})
    values.update(changes)
    return stats.ServerWindow(**values)


def test_full_batches_split_into_model_backend_and_turnaround():
    cycle = batch_cycle(_window(), throughput_rps=930.0, concurrency=16, fixed_ms=10.0, per_item_ms=0.2)
    assert cycle["cycle_ms"] == pytest.approx(1000 * 16 / 930)          # 17.20 ms between batch starts
    assert cycle["model_ms"] == pytest.approx(13.2)                      # 10 + 16 * 0.2
    assert cycle["backend_ms"] == pytest.approx(0.25 + 14.25 + 0.6 - 13.2)
    assert cycle["turnaround_ms"] == pytest.approx(cycle["cycle_ms"] - 15.1)
    assert cycle["of_ceiling"] == pytest.approx(930 / (16 / 0.0132))
    assert cycle["server_bound"] == pytest.approx(13.2 / 15.1)           # 0.874 with an instant client


def test_the_parts_add_up_on_a_recorded_window():
    before = json.loads((DATA / "stats_before.json").read_text())
    after = json.loads((DATA / "stats_after.json").read_text())
    window = stats.window(before, after, "cost_model")
    cycle = batch_cycle(window, throughput_rps=400.0, concurrency=8, fixed_ms=10.0, per_item_ms=0.2)
    assert math.isclose(cycle["model_ms"] + cycle["backend_ms"] + cycle["turnaround_ms"], cycle["cycle_ms"])
    assert cycle["model_ms"] == pytest.approx(10 + 0.2 * window.avg_batch)
    # The recorded executions took longer than the model's own cost: the stub hand-off is real.
    assert cycle["backend_ms"] > 0


def test_a_window_without_executions_is_refused():
    with pytest.raises(ValueError, match="executions"):
        batch_cycle(_window(executions=0), throughput_rps=100.0, concurrency=16, fixed_ms=10, per_item_ms=0.2)
    with pytest.raises(ValueError, match="throughput"):
        batch_cycle(_window(), throughput_rps=0.0, concurrency=16, fixed_ms=10, per_item_ms=0.2)


def test_cost_parameters_come_from_the_live_config():
    shipped = text_format.Parse((MODEL_REPOSITORY / "cost_model" / "config.pbtxt").read_text(), ModelConfig())
    assert cost_parameters(shipped) == (10.0, 0.2)
    shipped.parameters["fixed_ms"].string_value = "0"
    assert cost_parameters(shipped) == (0.0, 0.2)
    assert cost_parameters(ModelConfig()) == (10.0, 0.2)  # the model's own defaults
