"""``fencegate groups carry``: finish a change of Redlock groups (protocol R30).

::

    fencegate groups carry --config F

``F`` has the new ``[locks] groups`` (or ``redis``) and the old ones as
``previous_groups``. Run it once every gateway runs with that config (none
with the old one is left): it copies the counters of every moved lock name
into its new group and waits until the leases holding a moved name in its old
group expired there. Then gateways may drop ``previous_groups``. Exit status:
0 done, 1 refused (bad config, no ``previous_groups``), 2 no config given, 3 a
node did not answer or is not synced in its current run, "resync pending" (run
it again).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from gateway.exit_codes import REFUSED, UNAVAILABLE, USAGE

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    """Register ``fencegate groups ...`` on the ``fencegate`` command's subparsers."""
    groups = subparsers.add_parser("groups", help="Redlock groups: finish a change of groups")
    verbs = groups.add_subparsers(required=True, metavar="VERB")
    p = verbs.add_parser(
        "carry",
        help="copy moved names' counters into their new groups, wait out old leases",
    )
    p.add_argument(
        "--config",
        default=os.environ.get("FENCEGATE_CONFIG"),
        help="TOML file, the change config ($FENCEGATE_CONFIG)",
    )
    p.set_defaults(handler=_carry)


def _carry(args: argparse.Namespace) -> int:
    # The server's modules load when the verb runs, not when the parser is built.
    from gateway.config import ConfigError, load_config
    from lockservice.carry import CarryFailed, carry_over
    from lockservice.placement import GroupSpec

    if not args.config:
        print("fencegate groups: --config FILE is required (or FENCEGATE_CONFIG)", file=sys.stderr)
        return USAGE
    try:
        config = load_config(args.config, env=os.environ)
    except ConfigError as exc:
        print(f"fencegate: {exc}", file=sys.stderr)
        return REFUSED
    locks = config.locks
    if not locks.previous_groups:
        print(
            f"fencegate groups: {args.config} has no [locks] previous_groups: nothing to carry",
            file=sys.stderr,
        )
        return REFUSED
    current = locks.groups or (GroupSpec.of(locks.redis),)
    try:
        report = asyncio.run(
            carry_over(current, locks.previous_groups, max_ttl=locks.max_ttl, node_timeout=5.0)
        )
    except CarryFailed as exc:
        print(f"fencegate groups: {exc}", file=sys.stderr)
        return UNAVAILABLE
    print(
        f"carried: {report.moved} moved name(s) of {report.scanned} counter(s) read, "
        f"{report.raised} counter(s) raised, waited {report.waited:.3f} s for old leases; "
        "gateways may now drop previous_groups"
    )
    return 0
