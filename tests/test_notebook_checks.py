"""``check`` and ``check_measured``: what a learner reads when a claim holds, is re-measured, or fails.

Pure functions of the numbers handed to them: no server is involved, so none is started.
"""

from __future__ import annotations

import builtins

import pytest
from tritonclient.utils import InferenceServerException

from lab_backends import notebook
from lab_backends.errors import LabBackendsError
from lab_backends.notebook import REMEASURE_FACTOR, Claim, check, check_claims, check_measured, stretched
from lab_backends.server.door_config import TRITON_DOWN


def test_check_prints_the_lesson_and_raises_when_it_does_not_hold(capsys) -> None:
    check(True, "it holds")
    assert "✓ it holds" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="not observed on this server: it does not"):
        check(False, "it does not")


def test_a_claim_that_holds_prints_expected_and_measured_and_does_not_remeasure(capsys) -> None:
    calls: list[float] = []
    data = check_measured("fast enough", {"ratio": 3.2}, lambda d: d["ratio"], above=2,
                          remeasure=lambda k: calls.append(k) or {"ratio": 0.0})
    assert data == {"ratio": 3.2} and calls == []
    out = capsys.readouterr().out
    assert "✓ fast enough" in out and "expected measured > 2" in out and "measured 3.2" in out


def test_a_miss_is_remeasured_once_over_a_longer_window_with_the_same_bound(capsys) -> None:
    calls: list[float] = []

    def remeasure(factor: float) -> dict:
        calls.append(factor)
        return {"ratio": 2.5}

    data = check_measured("fast enough", {"ratio": 1.9}, lambda d: d["ratio"], above=2, remeasure=remeasure)
    assert calls == [REMEASURE_FACTOR] and REMEASURE_FACTOR > 1
    assert data == {"ratio": 2.5}, "the data the claim held on comes back, for the cells below"
    out = capsys.readouterr().out
    assert "measured 1.9" in out and "busy" in out and "re-measuring once" in out and "✓ fast enough" in out


def test_a_second_miss_fails_with_both_numbers_the_busy_machine_hint_and_how_to_rerun() -> None:
    calls: list[float] = []
    with pytest.raises(AssertionError) as caught:
        check_measured("slow enough", 5.0, float, below=4, what="p99 ms",
                       remeasure=lambda k: calls.append(k) or 4.0)
    assert calls == [REMEASURE_FACTOR], "exactly one re-measurement"
    message = str(caught.value)
    assert isinstance(caught.value, LabBackendsError)
    assert "slow enough" in message and "expected p99 ms < 4" in message and "measured 5, then 4" in message
    assert "machine may be busy" in message and "re-run this cell" in message


def test_the_bound_is_strict_on_both_sides_and_required() -> None:
    with pytest.raises(AssertionError):
        check_measured("inside", 1.5, float, above=0.5, below=1.5)
    assert check_measured("inside", 1.0, float, above=0.5, below=1.5) == 1.0
    with pytest.raises(ValueError, match="needs a bound"):
        check_measured("no bound", 1.0, float)


def test_stretched_scales_only_the_window_of_a_load() -> None:
    load = {"requests": 400, "duration_s": 2.5, "progress": False}
    assert stretched(load, 2.0) == {"requests": 800, "duration_s": 5.0, "progress": False}
    assert load["requests"] == 400, "the original load is left alone"


def test_claims_sharing_a_measurement_are_all_checked_again_on_the_new_one(capsys) -> None:
    ratio = Claim("batching pays", lambda d: d[0], above=2)
    p99 = Claim("and is sooner", lambda d: d[1], below=1)
    data = check_claims((3.0, 1.2), [ratio, p99], remeasure=lambda k: (2.5, 0.8))
    assert data == (2.5, 0.8)
    out = capsys.readouterr().out
    assert "✓ batching pays  (expected measured > 2, measured 2.5)" in out
    with pytest.raises(AssertionError, match="batching pays") as caught:
        check_claims((3.0, 1.2), [ratio, p99], remeasure=lambda k: (1.5, 0.8))
    assert "and is sooner" not in str(caught.value), "only the claim that missed the second time is reported"


class _Shell:
    """The two IPython calls explain_restarts makes, recorded."""

    def __init__(self) -> None:
        self.handler, self.shown = None, []

    def set_custom_exc(self, types, handler):
        self.types, self.handler = types, handler

    def showtraceback(self, exc_tuple, tb_offset=None):
        self.shown.append(exc_tuple[1])


def test_a_restarting_shared_server_prints_one_line_and_other_errors_their_traceback(monkeypatch, capsys):
    assert not notebook.explain_restarts()  # no IPython here: nothing registered
    shell = _Shell()
    monkeypatch.setattr(builtins, "get_ipython", lambda: shell, raising=False)
    assert notebook.explain_restarts() and not notebook.explain_restarts()  # once per kernel
    down = InferenceServerException(f"[StatusCode.UNAVAILABLE] {TRITON_DOWN}")  # what tritonclient raises then
    assert shell.handler(shell, type(down), down, None) is None
    assert capsys.readouterr().err.strip() == ("the shared server is restarting after a crash (its front door says "
                                               "so): run this cell again in a few seconds")
    other = ValueError("a learner's own mistake")
    shell.handler(shell, ValueError, other, None)
    assert shell.shown == [other]  # shown as IPython shows any error
