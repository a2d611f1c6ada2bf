"""benchmarks.locks: the per-round ratio behind the contention table's medians."""

from __future__ import annotations

from benchmarks.locks import contention_note


def test_each_round_is_divided_by_that_rounds_fastest_peer() -> None:
    note = contention_note(
        {
            "fencegate": [600.0, 580.0, 570.0],
            "aioredlock": [27.0, 0.0, 544.0],  # stalled in two rounds
            "pottery AIORedlock": [500.0, 400.0, 480.0],
        }
    )
    # 600/500, 580/400, 570/544: not the median of one peer's rounds
    assert "per round 1.05..1.45" in note
    assert "Medians of 3 alternating rounds" in note


def test_no_note_without_fencegate_or_a_peer() -> None:
    assert contention_note({"fencegate": [600.0]}) == ""
    assert contention_note({"aioredlock": [500.0]}) == ""
