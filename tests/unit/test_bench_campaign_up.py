"""``benchmarks/bench_campaign_up.py``'s reading of the attempts' timestamps (the figures of the campaign-up page)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from benchmarks.bench_campaign_up import attempt_timeline, realization_row

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_idle_before_is_the_gap_from_the_previous_accepted_result_to_the_claim_and_may_be_negative():
    # (index, claimed, started, ended), given out of claim order: realisation 2 was claimed 0.8 s before
    # realisation 1's result was accepted (a slot freed when its runner ended).
    attempts = [(2, at(30.2), at(30.5), at(55.0)), (0, at(0), at(1.0), at(20.0)), (1, at(24.0), at(24.5), at(31.0))]
    timeline = attempt_timeline(attempts)
    assert timeline[0] == {"started_to_ended_s": 19.0, "idle_before_s": None}
    assert timeline[1] == {"started_to_ended_s": 6.5, "idle_before_s": 4.0}
    assert timeline[2]["idle_before_s"] == pytest.approx(-0.8)
    # A realisation without an ended attempt has no duration, and the next gap counts from the last end.
    unfinished = attempt_timeline([(0, at(0), at(1.0), at(20.0)), (1, at(21.0), None, None), (2, at(22.0), at(22.5), None)])
    assert unfinished[1] == {"started_to_ended_s": None, "idle_before_s": 1.0}
    assert unfinished[2] == {"started_to_ended_s": None, "idle_before_s": 2.0}


def test_outside_is_the_attempts_duration_less_the_map_makers_own_total():
    result = {
        "samples": 1000,
        "observed_pixels": 10,
        "iterations": 5,
        "timing": {"total": 15.25},
        "peak_memory_mb": {"max": 100.0},
        "stages": {},
        "products": [{"size_bytes": 2**20}],
    }
    row = realization_row(1, result, {"started_to_ended_s": 19.0, "idle_before_s": 4.0})
    assert row["outside_s"] == pytest.approx(3.75) and row["idle_before_s"] == 4.0 and row["product_mib"] == 1.0
    assert realization_row(1, result, {})["outside_s"] is None
