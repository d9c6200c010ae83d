"""Timing claims with LAB_FORCE_REMEASURE=1: each fallback runs and its claims hold on the new measurement.

Why: a timing claim's ``remeasure`` runs only when a bound is missed on a busy machine, so a fault
in it waits for a learner's slow day. Notebook 10's four fallbacks once called a module that was
never imported (``NameError: observability``) and no run on a quiet machine could see it.
``LAB_FORCE_REMEASURE=1`` (read by :func:`lab_backends.notebook.check_claims`) makes every claim
re-measure as if its first try had missed, with the same bounds.

Here: ``check_claims`` with the knob, no server. The notebooks themselves run forced in ``make test``'s
nbval pass (``LAB_FORCE_REMEASURE=1``), and ``tests/check_fallbacks.py`` reads what it executed: every
lesson's every fallback ran and its claims held, notebook 10's four among them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_backends.notebook import (
    FORCED_FACTOR,
    REMEASURE_FACTOR,
    Claim,
    check_claims,
    check_measured,
    forced_remeasure,
    measure_rounds,
)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "10_observability_and_caching.ipynb"
FORCED = "LAB_FORCE_REMEASURE=1: re-measuring once"


def test_the_knob_is_off_unless_set(monkeypatch) -> None:
    monkeypatch.delenv("LAB_FORCE_REMEASURE", raising=False)
    assert not forced_remeasure()
    monkeypatch.setenv("LAB_FORCE_REMEASURE", "1")
    assert forced_remeasure()


def test_forced_a_claim_that_holds_is_remeasured_and_checked_on_the_new_data(monkeypatch, capsys) -> None:
    monkeypatch.setenv("LAB_FORCE_REMEASURE", "1")
    calls: list[float] = []
    data = check_measured("fast enough", {"ratio": 3.0}, lambda d: d["ratio"], above=2,
                          remeasure=lambda k: calls.append(k) or {"ratio": 2.5})
    assert calls == [FORCED_FACTOR] and data == {"ratio": 2.5}  # the first round's window: it held
    out = capsys.readouterr().out
    assert FORCED in out and "✓ fast enough" in out and "measured 2.5" in out
    assert "busy" not in out, "a forced re-measurement does not blame the machine"


def test_forced_the_bounds_are_not_relaxed(monkeypatch) -> None:
    monkeypatch.setenv("LAB_FORCE_REMEASURE", "1")
    with pytest.raises(AssertionError, match="measured 3, then 1.5, then 1.5"):
        check_claims({"r": 3.0}, [Claim("fast enough", lambda d: d["r"], above=2)], remeasure=lambda k: {"r": 1.5})


def test_forced_a_fallback_that_misses_once_gets_the_retry_a_real_miss_gets(monkeypatch, capsys) -> None:
    """Forcing must not make a lesson flakier: a forced round that misses is re-measured once, like a miss."""
    monkeypatch.setenv("LAB_FORCE_REMEASURE", "1")
    rounds, factors = iter([{"r": 1.5}, {"r": 2.5}]), []
    assert check_measured("fast enough", {"r": 3.0}, lambda d: d["r"], above=2,
                          remeasure=lambda k: factors.append(k) or next(rounds)) == {"r": 2.5}
    assert factors == [FORCED_FACTOR, REMEASURE_FACTOR]  # the retry of a real miss: the longer window
    assert "the forced re-measurement missed" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="measured 3, then 1.5, then 1.5"):
        check_measured("fast enough", {"r": 3.0}, lambda d: d["r"], above=2, remeasure=lambda k: {"r": 1.5})


def test_forced_without_a_fallback_nothing_changes(monkeypatch) -> None:
    monkeypatch.setenv("LAB_FORCE_REMEASURE", "1")
    assert check_measured("holds", 3.0, float, above=2) == 3.0


def test_measure_rounds_retries_a_miss_once_over_the_longer_window(monkeypatch, capsys) -> None:
    """The retry an exercise checker shares with the claims (03's tune_the_batcher): one, longer, bounded."""
    monkeypatch.delenv("LAB_FORCE_REMEASURE", raising=False)
    factors: list[float] = []
    assert measure_rounds(5, lambda x: x > 3, lambda k: factors.append(k) or 9) == [5, 9]
    assert factors == [REMEASURE_FACTOR], "a second miss is not re-measured again: the last round decides"
    assert "the machine may be busy: re-measuring once over a 2x window" in capsys.readouterr().out
    assert measure_rounds(1, lambda x: x > 3, lambda k: factors.append(k) or 9) == [1]
    assert factors == [REMEASURE_FACTOR], "a first round that held is not re-measured"
    assert measure_rounds(5, lambda x: x > 3, None) == [5]


def test_measure_rounds_forced_runs_the_fallback_and_retries_only_its_miss(monkeypatch) -> None:
    monkeypatch.setenv("LAB_FORCE_REMEASURE", "1")
    factors: list[float] = []
    assert measure_rounds(1, lambda x: x > 3, lambda k: factors.append(k) or 2) == [1, 2]
    assert factors == [FORCED_FACTOR]
    rounds = iter([5, 2])
    assert measure_rounds(1, lambda x: x > 3, lambda k: factors.append(k) or next(rounds)) == [1, 5, 2]
    assert factors == [FORCED_FACTOR, FORCED_FACTOR, REMEASURE_FACTOR]
