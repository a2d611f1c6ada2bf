"""benchmarks.locks: the per-round ratios behind the tables' medians."""

from __future__ import annotations

from benchmarks.locks import median_row, rounds_note


def test_each_round_is_divided_by_that_rounds_fastest_peer() -> None:
    note = rounds_note(
        {
            "fencegate": [600.0, 580.0, 570.0],
            "aioredlock": [27.0, 0.0, 544.0],  # stalled in two rounds
            "pottery AIORedlock": [500.0, 400.0, 480.0],
        }
    )
    # 600/500, 580/400, 570/544: not the median of one peer's rounds
    assert "per round 1.05..1.45 (median 1.20)" in note
    assert "Medians of 3 alternating rounds" in note
    assert "MONITOR" in note  # contention's commands are counted in a run of their own


def test_a_cycle_table_has_no_command_count_note() -> None:
    note = rounds_note({"fencegate": [4600.0, 4400.0], "aioredlock": [3100.0, 3200.0]}, "cycles")
    assert "per round 1.38..1.48" in note
    assert "MONITOR" not in note


def test_no_note_without_fencegate_or_a_peer() -> None:
    assert rounds_note({"fencegate": [600.0]}) == ""
    assert rounds_note({"aioredlock": [500.0]}) == ""


def test_failures_add_up_over_the_rounds_and_rates_take_the_median() -> None:
    row = median_row(
        [
            {"cycles_per_s": 10.0, "errors": 0, "workers_gave_up": 0},
            {"cycles_per_s": 30.0, "errors": 2, "workers_gave_up": 8},
            {"cycles_per_s": 20.0, "errors": 0, "workers_gave_up": 0},
        ]
    )
    assert row == {"cycles_per_s": 20.0, "errors": 2, "workers_gave_up": 8}


def test_a_round_without_takeovers_does_not_void_the_others_latency() -> None:
    nan = float("nan")
    row = median_row(
        [
            {"takeover_p50_ms": 2.0, "cs_per_s": 500.0},
            {"takeover_p50_ms": nan, "cs_per_s": 0.0},  # a stalled round: no takeover
            {"takeover_p50_ms": 4.0, "cs_per_s": 400.0},
        ]
    )
    assert row == {"takeover_p50_ms": 3.0, "cs_per_s": 400.0}
    assert median_row([{"takeover_p50_ms": nan}])["takeover_p50_ms"] != 0  # NaN: none known
