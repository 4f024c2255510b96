"""Benchmark: ``gpu-cost replay`` over a week of 1-minute samples at 100 and 1,000 GPUs (about 10 M rows).

Each size: write the trace once with ``gpu-cost sim-trace`` (samples.parquet + jobs.csv, not
timed; cached under ``--cache``), then run ``gpu-cost replay --samples ... --jobs ... --json`` as a
user would, in its own process, and report its wall time, its peak RSS (the child's own
``ru_maxrss``, from ``wait4``), rows per second and what it decided. Target for the 10 M-row week:
under 10 s and 1 GB on a 2-core machine (it was 60 s and 4 GB before the scale work).

    python -m bench.replay [--gpus 100,1000] [--days 7] [--cache .gpu_cost/bench-traces]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import report

ROOT = Path(__file__).resolve().parents[1]
END = 1_795_960_800  # a fixed trace end, so the cached traces are reproducible
TARGET_S, TARGET_MB = 10.0, 1024.0


def _gpu_cost() -> str:
    exe = Path(sys.executable).with_name("gpu-cost")
    return str(exe) if exe.exists() else "gpu-cost"


def trace(cache: Path, gpus: int, days: float, seed: int = 0) -> dict[str, Any]:
    """Return the sim-trace summary for ``gpus`` x ``days``, writing the trace when it is not cached."""
    out = cache / f"g{gpus}-d{days:g}-s{seed}"
    meta = out / "trace.json"
    if meta.exists():
        return dict(json.loads(meta.read_text()))
    r = subprocess.run([_gpu_cost(), "sim-trace", "--gpus", str(gpus), "--days", f"{days:g}", "--seed", str(seed),
                        "--end", str(END), "--out", str(out), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"gpu-cost sim-trace failed:\n{r.stderr[-3000:]}")
    info = dict(json.loads(r.stdout))
    meta.write_text(json.dumps(info))
    return info


def run_replay(samples: str, jobs: str) -> tuple[dict[str, Any], float, float]:
    """Run ``gpu-cost replay`` in a child process; return (payload, wall seconds, child peak RSS in MB)."""
    argv = [_gpu_cost(), "replay", "--samples", samples, "--jobs", jobs, "--json", "--actions-limit", "0"]
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"gpu-cost replay exited {proc.returncode}:\n{err.read().decode()[-3000:]}")
    return json.loads(out), wall, usage.ru_maxrss / 1024.0


def one(cache: Path, gpus: int, days: float) -> dict[str, Any]:
    info = trace(cache, gpus, days)
    payload, wall, peak = run_replay(info["samples"], info["jobs_file"])
    rows = int(info["samples_rows"])
    big = rows >= 5_000_000
    return {
        "gpus": payload["gpus"], "days": days, "rows": rows, "jobs": payload["jobs"], "sweeps": payload["sweeps"],
        "wall_s": wall, "replay_s": payload["seconds"], "peak_mb": peak, "rows_per_s": rows / wall,
        "ms_per_sweep": 1000 * wall / max(1, payload["sweeps"]), "kills": payload["kills"],
        "false_kills": payload["false_kills"], "reclaimed_gpu_h": payload["reclaimed_gpu_hours"],
        "idle_gpu_h": payload["idle_gpu_hours"],
        "target": f"<{TARGET_S:g}s <{TARGET_MB:g}MB" if big else "-",
        "meets_target": (wall < TARGET_S and peak < TARGET_MB) if big else None,
        "load_avg_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default="100,1000", help="trace sizes in GPUs (rounded up to whole 8-GPU nodes)")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--cache", default=str(ROOT / ".gpu_cost" / "bench-traces"), help="where traces are kept")
    args = ap.parse_args(argv)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = [one(cache, int(g), args.days) for g in args.gpus.split(",")]
    report("replay", rows, ["gpus", "days", "rows", "jobs", "sweeps", "wall_s", "replay_s", "peak_mb", "rows_per_s",
                            "ms_per_sweep", "kills", "false_kills", "reclaimed_gpu_h", "target", "meets_target",
                            "load_avg_1m"])


if __name__ == "__main__":
    main(sys.argv[1:])
