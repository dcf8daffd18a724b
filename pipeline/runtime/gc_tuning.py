"""Garbage-collector settings for the pipeline's own long-running processes.

CPython collects its youngest generation every 700 net container allocations. A delivery worker
keeps up to ``max_in_flight`` records alive for the length of a request (a task, its coroutine
frames, aiohttp's request and response objects), so those collections keep finding survivors,
promote them, and trigger older-generation passes over everything the process holds: these
settings gave one worker about 15 % more deliveries a second (docs/decisions.md).

``tune_for_throughput`` freezes what exists after start-up (modules, settings: never garbage) so
that full collections skip it, and collects the young generation every 50,000 allocations: still
often enough that reference cycles are freed within a fraction of a second at full load. Only the
``pipeline`` commands call it; an application that imports the client library keeps its own
settings.

    >>> import gc, subprocess, sys
    >>> code = ("from pipeline.runtime.gc_tuning import tune_for_throughput as t; t(); "
    ...         "import gc; print(gc.get_threshold())")
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    '(50000, 20, 100)'
"""

from __future__ import annotations

import gc

__all__ = ["tune_for_throughput", "THRESHOLDS"]

#: (young, middle, old): collections of each generation, as ``gc.set_threshold`` takes them.
THRESHOLDS = (50_000, 20, 100)


def tune_for_throughput() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
