"""The one table from error class to status agrees with DESIGN.md's codes."""

from __future__ import annotations

from gateway.errors import STATUS, NotLeaseHolder, status_of
from storage_adapters.errors import StaleToken

DESIGN = {
    "bad_request": 400,
    "bad_token": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "token_not_issued": 403,
    "not_found": 404,
    "unknown_store": 404,
    "lock_held": 409,
    "lease_lost": 409,
    "stale_token": 409,
    "too_large": 413,
    "token_required": 428,
    "quorum_unavailable": 503,
    "storage_unavailable": 503,
}


def test_every_design_code_has_its_status() -> None:
    codes: dict[str, set[int]] = {}
    for cls, status in STATUS.items():
        codes.setdefault(getattr(cls, "code", ""), set()).add(status)
    for code, status in DESIGN.items():
        assert codes.get(code) == {status}, code


def test_subclasses_take_the_status_of_their_nearest_base() -> None:
    class Stale(StaleToken):
        pass

    assert status_of(Stale(1, 2)) == 409
    assert status_of(NotLeaseHolder("x", 1, None, 2)) == 409
    assert status_of(KeyError("x")) is None
