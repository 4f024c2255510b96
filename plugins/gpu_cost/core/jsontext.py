"""Compact JSON for what the audit store parks between a run's tasks: its snapshot, findings and plan.

At 100,000 GPUs these are 45–140 MB each, written once and read by several tasks. msgspec writes
and reads them several times faster than the standard library, and the cycle collector waits
meanwhile (:func:`gpu_cost.core.perf.gc_paused`: millions of live objects, none to free). The text
is strict JSON: a number that is not finite is written ``null`` (read back as None, "not known");
text an older version wrote with the standard library's ``NaN`` is still read.
"""

from __future__ import annotations

import json
from typing import Any

from gpu_cost.core.perf import gc_paused


def _plain(value: Any) -> Any:
    """Return what JSON can hold for a value msgspec does not write itself (a NumPy scalar: its number)."""
    return value.item() if hasattr(value, "item") else str(value)


def raw(text: str) -> Any:
    """Return ``text``, already JSON (a frame as pandas writes it), to be embedded as it is by :func:`dumps`."""
    import msgspec

    return msgspec.Raw(text.encode())


@gc_paused()
def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """Return ``value`` as compact JSON; ``sort_keys``: every object's keys in order (a text to compare)."""
    import msgspec

    return msgspec.json.encode(value, enc_hook=_plain, order="sorted" if sort_keys else None).decode()


@gc_paused()
def loads(text: str | bytes) -> Any:
    """Return the value of JSON ``text`` (:func:`dumps`' or an older writer's, with ``NaN`` in it)."""
    import msgspec

    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)
