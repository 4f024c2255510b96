"""A sweep whose exporter reports no framebuffer memory says so: a warning among the run's problems, not a
degradation; the replay's note on such a trace is worded the same way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpu_cost.config.loader import load_policy
from gpu_cost.core.model import Snapshot
from gpu_cost.loop import sweep
from gpu_cost.perceive.snapshot import MEMORY_NOT_MEASURED

NOW = 1_795_910_400.0


@pytest.fixture(scope="module")
def snap() -> Snapshot:
    return sweep.collect(load_policy(), NOW, "sim")


def _without_memory(snap: Snapshot, rows: np.ndarray) -> Snapshot:
    g = snap.gpus.copy()
    for col in ("mem_min_mib", "mem_max_mib"):
        g.loc[rows, col] = np.nan
    return dataclasses.replace(snap, gpus=g)


def test_no_framebuffer_reading_on_any_fresh_gpu_is_a_warning_not_a_degradation(snap: Snapshot) -> None:
    g = snap.gpus
    every = np.ones(len(g), dtype=bool)
    assert len(g) and not snap.degraded and sweep.run_warnings(snap, {"warnings": []}) == []
    blind = _without_memory(snap, every)
    said = sweep.run_warnings(blind, {"warnings": ["the schedule disagrees"]})
    assert said[0] == "the schedule disagrees" and len(said) == 2
    assert "DCGM_FI_DEV_FB_USED" in said[1] and MEMORY_NOT_MEASURED in said[1] and not blind.degraded
    # one host's exporter without the metric (a mixed fleet): that host is named; a host where one GPU still
    # reads it has the metric (its other GPUs' readings are what is missing)
    hosts = sorted(set(g["host"]))
    assert len(hosts) > 2
    one = _without_memory(snap, (g["host"] == hosts[1]).to_numpy())
    (said,) = sweep.run_warnings(one, {"warnings": []})
    assert said.startswith(f"no GPU of 1 of {len(hosts)} host(s) ({hosts[1]}) reports framebuffer memory used"), said
    assert MEMORY_NOT_MEASURED in said and not one.degraded
    first = (g["host"] == hosts[0]).to_numpy()
    assert first.sum() > 1
    some = _without_memory(snap, first & (np.cumsum(first) > 1))
    assert sweep.run_warnings(some, {"warnings": []}) == []
    # the GPUs that measure it are stale, or outside the scheduler: the cluster's fresh GPUs measure none
    for col, value in (("stale", True), ("attribution", "outside")):
        other = blind.gpus.copy()
        other.loc[0, col] = value
        other.loc[0, "mem_max_mib"] = 1000.0
        assert len(sweep.run_warnings(dataclasses.replace(blind, gpus=other), {"warnings": []})) == 1, col
    # every GPU stale: the run is degraded for that, and the memory says nothing more
    stale = blind.gpus.assign(stale=True)
    assert sweep.run_warnings(dataclasses.replace(blind, gpus=stale), {"warnings": []}) == []
