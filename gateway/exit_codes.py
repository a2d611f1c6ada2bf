"""The exit statuses of the ``fencegate`` client verbs, ``pg`` and ``groups``.

0 done; ``REFUSED`` the gateway or the database said no (a 4xx answer, a check
that failed); ``USAGE`` the command line or the client's own setup is wrong (no
retry helps); ``UNAVAILABLE`` the gateway, a node or the database could not be
reached or answered 5xx (try again). ``fencegate run`` exits with its command's
status instead (see gateway/run.py).
"""

from typing import Final

__all__ = ["REFUSED", "UNAVAILABLE", "USAGE"]

REFUSED: Final = 1
USAGE: Final = 2
UNAVAILABLE: Final = 3
