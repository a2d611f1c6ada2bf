"""``python -m gateway``: the ``fencegate`` command."""

from gateway.cli import main

raise SystemExit(main())
