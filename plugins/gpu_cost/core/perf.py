"""Keep Python's cycle collector out of the sweep's hot phases.

A sweep of a large cluster builds hundreds of thousands of small objects (jobs, evidence, decisions)
on top of millions it already holds. Each of CPython's full collections walks all of them, and
allocation at that rate triggers several per phase: at 100,000 GPUs and 200,000 jobs they took
about 2.7 s of the sweep, with nothing to free (the objects are alive). :func:`gc_paused` turns the
collector off for one phase and back on after it (on error too); garbage without cycles is freed
as always, and cycles made in the phase wait for the next collection. The phases: the snapshot,
the rules, the merge of a sharded sweep's groups, the decision, and the snapshot's JSON the audit
store parks for a run's later tasks, written and read.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cycle collector for the block (a decorator too); nested uses leave it to the outermost."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
