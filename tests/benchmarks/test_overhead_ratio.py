"""The HTTP-overhead ratio's parts: which in-process cycle each load generator's rows
divide by (``benchmarks.gateway.http_overhead``), and callgrind's totals by event
(``benchmarks.gateway_cost.dump_totals``)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.gateway import (
    BARE_CASE,
    BARE_LEAN_CASE,
    HTTP_CASE,
    HTTP_LEAN_CASE,
    INPROC_CASE,
    INPROC_FRESH_CASE,
    http_overhead,
)
from benchmarks.gateway_cost import dump_totals


def _round(gw: float, bare: float, fixed: float, fresh: float) -> dict[str, Any]:
    rows = {
        HTTP_LEAN_CASE: {"gw_cpu_us": gw},
        BARE_LEAN_CASE: {"gw_cpu_us": bare},
        HTTP_CASE: {"gw_cpu_us": gw + 20},
        BARE_CASE: {"gw_cpu_us": bare + 20},
        INPROC_CASE: {"gen_cpu_us": fixed},
        INPROC_FRESH_CASE: {"gen_cpu_us": fresh},
    }
    return {"locks/32_clients": rows}


def test_cyclegen_rows_divide_by_the_cycle_on_new_names_the_aiohttp_rows_by_fixed_ones() -> None:
    # cyclegen locks a new name every cycle, the aiohttp client one name per client: each
    # gateway row is set against the in-process cycle on the same kind of names
    out = http_overhead([_round(240.0, 110.0, 80.0, 100.0), _round(250.0, 110.0, 80.0, 100.0)])
    lean, client = out["locks/32_clients, cyclegen"], out["locks/32_clients, aiohttp"]
    assert lean["lockmanager_cpu_us"] == 100.0
    assert lean["median"] == pytest.approx(245.0 / 210.0)
    assert (lean["min"], lean["max"]) == pytest.approx((240.0 / 210.0, 250.0 / 210.0))
    assert client["lockmanager_cpu_us"] == 80.0
    assert client["median"] == pytest.approx(265.0 / 210.0)


def test_a_round_without_the_cycle_on_new_names_gives_no_cyclegen_row() -> None:
    rnd = _round(240.0, 110.0, 80.0, 100.0)
    del rnd["locks/32_clients"][INPROC_FRESH_CASE]
    out = http_overhead([rnd])
    assert "locks/32_clients, cyclegen" not in out
    assert out["locks/32_clients, aiohttp"]["lockmanager_cpu_us"] == 80.0


def test_dump_totals_names_each_count_by_its_event() -> None:
    dump = (
        b"# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\n"
        b"events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
        b"summary: 0\n\nfl=(1) x.c\nfn=(1) f\n3 5 1\n\ntotals: 1000 400 200 30 20 10 3\n"
    )
    assert dump_totals(dump) == {
        "Ir": 1000, "Dr": 400, "Dw": 200, "I1mr": 30, "D1mr": 20, "D1mw": 10,
        "ILmr": 3, "DLmr": 0, "DLmw": 0,
    }  # fmt: skip
    assert dump_totals(b"events: Ir\ntotals: 77\n") == {"Ir": 77}
    assert dump_totals(b"events: Ir\n") == {}
