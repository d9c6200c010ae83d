"""How many sequences the sequence batcher holds open at once, measured on a real server (running_mean).

Triton core ``src/sequence_batch_scheduler/sequence_batch_scheduler.cc`` at r24.10: each instance
gets ``max(1, max_batch_size)`` sequence slots, or ``oldest.max_candidate_sequences`` when the
``oldest`` strategy sets it (lines 160-171, 294-323); a sequence that starts with every slot taken
waits, unanswered, in a backlog (806-839) until an ended sequence frees a slot (915-978). The
evidence is counts, not timings: which STARTs were answered, and how many requests the statistics
say the model executed.
"""

from __future__ import annotations

import threading
import time

import pytest

from lab_backends.client import sequences
from lab_backends.measure import concurrent_sequences
from lab_backends.measure.concurrent_sequences import drive_concurrent, fill_slots, sequence_slots, without_batching
from lab_backends.server.config_changes import apply_config
from lab_backends.server.repository import ModelConfig


def _config(max_batch_size: int, instances: int = 1, strategy: str = "oldest", candidates: int = 0) -> ModelConfig:
    config = ModelConfig(name="m", max_batch_size=max_batch_size)
    config.input.add(name="VALUE", dims=[1])
    config.output.add(name="MEAN", dims=[1])
    config.instance_group.add(count=instances)
    if strategy == "oldest":
        config.sequence_batching.oldest.max_candidate_sequences = candidates
        if max_batch_size:
            config.sequence_batching.oldest.preferred_batch_size.append(max_batch_size)
    else:
        config.sequence_batching.direct.SetInParent()
    return config


def test_sequence_slots_follow_the_scheduler() -> None:
    assert sequence_slots(_config(8, candidates=16)) == 16  # running_mean as shipped
    assert sequence_slots(_config(8, instances=2, candidates=2)) == 4  # per instance
    assert sequence_slots(_config(0, candidates=3)) == 3  # max_batch_size 0 does not mean one
    assert sequence_slots(_config(8)) == 8  # oldest without max_candidate_sequences: max_batch_size
    assert sequence_slots(_config(0)) == 1
    assert sequence_slots(_config(4, instances=3, strategy="direct")) == 12


def test_without_batching_keeps_the_request_shape_and_drops_preferred_sizes() -> None:
    config = without_batching(_config(8, candidates=16))
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1, 1] and list(config.output[0].dims) == [1, 1]
    assert list(config.sequence_batching.oldest.preferred_batch_size) == []
    assert config.sequence_batching.oldest.max_candidate_sequences == 16
    assert list(without_batching(config).input[0].dims) == [1, 1]  # already unbatched: unchanged


@pytest.fixture(scope="module")
def server():
    from lab_backends.server.triton_server import TritonServer

    with TritonServer(models=["running_mean"], startup_timeout_s=180) as srv:
        srv.shipped = srv.model_config("running_mean")  # every test reloads from it, and restores it
        yield srv


@pytest.mark.server
class TestOnTheServer:
    def test_as_shipped_16_slots_and_the_17th_waits_for_an_end(self, server) -> None:
        probe = fill_slots(server)
        assert probe.slots == 16 and len(probe.started) == 17
        assert len(probe.answered) == 16 and len(probe.waiting) == 1 and probe.probe_answered
        assert probe.executed == 17  # 16 STARTs + the later request; the backlogged START did not run
        assert probe.admitted == probe.waiting
        assert list(probe.frame["START answered"]).count("after an END freed a slot") == 1
        assert not any(sequences.is_live(server, c) for c in probe.started)  # fill_slots ended them all

    def test_a_start_whose_thread_returns_after_its_end_is_still_answered(self, server, monkeypatch) -> None:
        """Forces what CI once saw under load: a backlogged START's reply reached its thread after its
        END's reply reached the END's thread. fill_slots must wait for the START, not call it unanswered."""
        ending = threading.Event()

        def slow_start_after_an_end(server, corrid, value, start=False, end=False, **kwargs):
            if end:
                ending.set()
            answer = sequences.step(server, corrid, value, start, end, **kwargs)
            if start and ending.is_set():
                time.sleep(1.0)  # this START was answered after an END was sent: return late
            return answer

        monkeypatch.setattr(concurrent_sequences, "step", slow_start_after_an_end)
        probe = fill_slots(server, extra=2)
        assert len(probe.waiting) == 2 and len(probe.admitted) == 1  # the other waits for the last ENDs

    def test_slots_are_per_instance_and_max_batch_size_0_keeps_them(self, server) -> None:
        def two_by_two(config):
            config.instance_group[0].count = 2
            config.sequence_batching.oldest.max_candidate_sequences = 2
            return without_batching(config)

        try:
            apply_config(server, "running_mean", two_by_two, server.shipped)
            probe = fill_slots(server, extra=2)
            assert probe.slots == 4 and len(probe.answered) == 4 and len(probe.waiting) == 2
            assert probe.executed == 5
            assert len(probe.admitted) == 1  # one END frees one slot: one of the two waiting gets in
            run = drive_concurrent(server, {c: [float(c), 2.0, 3.0] for c in range(301, 307)})
            assert run.correct and set(run.server.batch_hist) == {1}  # one request per execute
        finally:
            server.load_model("running_mean", config=server.shipped)

    def test_direct_with_max_batch_size_0_runs_one_sequence_at_a_time(self, server) -> None:
        def direct(config):
            config = without_batching(config)
            config.sequence_batching.direct.SetInParent()  # a oneof: the oldest strategy goes
            return config

        try:
            apply_config(server, "running_mean", direct, server.shipped)
            probe = fill_slots(server)
            assert probe.slots == 1 and len(probe.answered) == 1 and len(probe.waiting) == 1
            assert probe.executed == 2 and probe.admitted == probe.waiting
        finally:
            server.load_model("running_mean", config=server.shipped)
