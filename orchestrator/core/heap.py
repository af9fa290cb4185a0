"""The garbage collector in the long-running processes: the API server and the
workers' pool children.

CPython's cycle collector runs every ``threshold[0]`` (700) net allocations, and
every so often a full collection walks every tracked object: in these processes
that is mostly what start-up built and what lives as long as the process (the
imported modules, FastAPI's routes and schemas, pydantic's validators,
SQLAlchemy's tables and compiled statements).  Profiled under 32 concurrent posts,
those passes took about a fifth of the API server's CPU (docs/performance.md,
"The HTTP path").

:func:`settle`, called once start-up is done, collects what start-up left behind,
then freezes the survivors (``gc.freeze``: never scanned again; still freed by
reference counting as before if they ever die) and collects the young generation
less often.  What is freed does not change: an object's memory still goes back at
once when its last reference goes, and cycles are still found, a little later.
"""

from __future__ import annotations

import gc

# Allocations between young-generation passes (CPython's default: 700). A pass costs
# in proportion to the young objects, so fewer, larger passes cost less in all; the
# older generations keep their own thresholds.
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Start-up is over: collect its garbage, freeze what survived, collect less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
