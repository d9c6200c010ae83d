"""server/warmup.py offline: the model_warmup sample it builds from a config's inputs."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from lab_backends.errors import LoadSettingError
from lab_backends.server.repository import ModelConfig
from lab_backends.server.warmup import SAMPLE, with_warmup

CONFIG = """
name: "m" max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, 3 ] },
        { name: "B" data_type: TYPE_INT64 dims: [ 2 ] },
        { name: "C" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
model_warmup [ { name: "theirs" batch_size: 2 count: 1 } ]
"""


def config() -> ModelConfig:
    return text_format.Parse(CONFIG, ModelConfig())


def test_every_required_input_gets_zeros_with_variable_dims_set_to_one() -> None:
    base = config()
    warmed = with_warmup(base, 3)
    sample = warmed.model_warmup[-1]
    assert (sample.name, sample.batch_size, sample.count) == (SAMPLE, 1, 3)
    assert list(sample.inputs["A"].dims) == [1, 3] and list(sample.inputs["B"].dims) == [2]
    assert sample.inputs["B"].data_type == base.input[1].data_type and sample.inputs["A"].zero_data
    assert "C" not in sample.inputs  # optional: a request may leave it out
    assert len(base.model_warmup) == 1, "the config passed in is not changed"


def test_applying_twice_replaces_ours_and_keeps_theirs() -> None:
    twice = with_warmup(with_warmup(config(), 1), 2)
    assert [w.name for w in twice.model_warmup] == ["theirs", SAMPLE]
    assert twice.model_warmup[1].count == 2


@pytest.mark.parametrize("count", [0, 101])
def test_count_out_of_range_is_refused(count: int) -> None:
    with pytest.raises(LoadSettingError, match="1..100"):
        with_warmup(config(), count)
