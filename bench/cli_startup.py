"""Benchmark: how long ``gpu-cost --help`` takes to answer, from a fresh process each time.

The help imports every command module; the heavy libraries (pandas, SQLAlchemy, Airflow) load
inside the handlers only, so it should answer in about the time the interpreter needs to start.
Each run is a fresh process; the median and the maximum wall time are reported, next to a bare
``python -c pass`` as the floor. Nothing is asserted: the figures are for reading.

    python -m bench.cli_startup [--repeat 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._common import report


def gpu_cost_command() -> list[str]:
    """Return the ``gpu-cost`` console script next to this interpreter, else on PATH, else ``python -m gpu_cost.cli.main``."""
    here = Path(sys.executable).parent / "gpu-cost"
    if here.is_file():
        return [str(here)]
    found = shutil.which("gpu-cost")
    return [found] if found else [sys.executable, "-m", "gpu_cost.cli.main"]


def timed(argv: list[str], repeat: int) -> dict[str, object]:
    """Run ``argv`` ``repeat`` times, each in a fresh process; return the median and max wall seconds."""
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        walls.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return {"runs": repeat, "median_s": statistics.median(walls), "max_s": max(walls)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    repeat = max(1, args.repeat)
    cmd = gpu_cost_command()
    rows = [
        {"command": " ".join([Path(cmd[0]).name, *cmd[1:], "--help"]), **timed([*cmd, "--help"], repeat)},
        {"command": "(python -c pass)", **timed([sys.executable, "-c", "pass"], repeat)},
    ]
    report("cli_startup", rows, ["command", "runs", "median_s", "max_s"])


if __name__ == "__main__":
    main(sys.argv[1:])
