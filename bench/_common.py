"""Shared bits of the benchmarks: run a measurement in a fresh process, print a table and a JSON line."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from typing import Any


def rss_mb() -> float:
    """Return this process's peak resident set size in MB (since :func:`reset_peak`, where it could reset it)."""
    hwm = _status_mb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def reset_peak() -> float:
    """Make the peak :func:`rss_mb` reads start from now, where Linux allows it; return the current RSS in MB.

    Without it a phase that stays under an earlier phase's peak (building a benchmark's input) reads 0.
    Elsewhere the lifetime peak is returned, as :func:`rss_mb` reads it.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set size (VmHWM) to the current one
    except OSError:
        return rss_mb()
    now = _status_mb("VmRSS")
    return now if now is not None else rss_mb()


def _status_mb(field: str) -> float | None:
    """Return a ``kB`` field of ``/proc/self/status`` in MB, or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def in_fresh_process(module: str, args: Sequence[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``python -m module args`` and return the JSON object it prints last."""
    env = dict(os.environ)
    env.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    r = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(name: str, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print the rows as a table, then one JSON line with everything."""
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print(f"\n## {name}")
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))
    print(json.dumps({"bench": name, "results": rows}))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if v < 100 else f"{v:,.1f}"
    return str(v)
