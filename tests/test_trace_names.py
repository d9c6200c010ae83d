"""trace_names on traces recorded from the real server (tests/data/traces): our stages, Triton's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_backends.errors import TraceError
from lab_backends.measure import trace
from lab_backends.measure.trace_names import DERIVED_STAGES, raw_timestamp_names, stage_sources

DATA = Path(__file__).parent / "data" / "traces" / "all.json"


def test_every_derived_stage_is_shown_between_two_of_tritons_timestamps() -> None:
    log = trace.read_trace(DATA)
    row = log.requests[log.requests["queue_ms"].notna() & log.requests["protocol"].notna()].iloc[0]
    table = stage_sources(log, int(row["trace_id"])).set_index("stage (ours)")
    assert table.loc["queue", "from (Triton's stamp)"] == "QUEUE_START"
    assert table.loc["queue", "to (Triton's stamp)"] == "COMPUTE_START"
    assert table.loc["infer", "from (Triton's stamp)"] == "COMPUTE_INPUT_END"
    assert "?" not in set(table["from (Triton's stamp)"]) | set(table["to (Triton's stamp)"])
    assert (table["end_ns"] >= table["start_ns"]).all()


def test_the_file_holds_tritons_names_and_none_of_ours() -> None:
    names = raw_timestamp_names(DATA)
    assert {"QUEUE_START", "COMPUTE_START", "INFER_RESPONSE_COMPLETE"} <= names
    assert not names & set(DERIVED_STAGES)


def test_an_unknown_trace_id_says_where_to_pick_one() -> None:
    with pytest.raises(TraceError, match="pick a trace_id"):
        stage_sources(trace.read_trace(DATA), -1)
