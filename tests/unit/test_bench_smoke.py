"""Tiny runs of every benchmark so they do not rot (figures are printed by `make bench`, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fixtures.core import ROOT


def run_bench(module: str, *args: str) -> dict:  # type: ignore[type-arg]
    r = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["bench"] and last["results"]
    return last


def test_sweep_bench_smoke() -> None:
    out = run_bench("bench.sweep", "--sizes", "80,160")
    sizes = [r["gpus"] for r in out["results"]]
    assert sizes == [80, 160]
    assert all(r["findings"] >= 0 and r["total_s"] > 0 for r in out["results"])


def test_soak_bench_smoke() -> None:
    out = run_bench("bench.soak", "--hours", "1")
    r = out["results"][0]
    assert r["runs"] == 12 and r["duplicate_decisions"] == 0


@pytest.mark.slow
def test_parse_bench_smoke() -> None:
    out = run_bench("bench.parse", "--repeat", "1")
    assert {r["dag_file"] for r in out["results"]} >= {"gpu_zombie_sweep.py"}
    assert all(r["errors"] == 0 and r["sql"] == 0 and r["lookups"] == 0 for r in out["results"])
