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


@pytest.mark.parametrize("seed", range(20))
def test_the_hosts_named_are_those_whose_fresh_gpus_all_lack_the_reading(seed: int) -> None:
    """Random fleets: hosts of 1-8 GPUs, some exporters without the framebuffer metric (every GPU NaN), some GPUs
    missing a reading on their own, some stale, some hosts outside the scheduler. The warning names exactly the
    cluster's hosts whose fresh GPUs all lack it; the whole cluster's wording when that is every host with a fresh
    GPU; nothing when none."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    share_blind = 1.0 if seed % 5 == 0 else 0.3  # every fifth fleet: no exporter reports it
    for h in range(int(rng.integers(1, 12))):
        blind, outside = rng.random() < share_blind, rng.random() < 0.15
        for i in range(int(rng.integers(1, 9))):
            mem = np.nan if blind or rng.random() < 0.2 else float(rng.integers(0, 80000))
            rows.append({"host": f"n{h:02d}", "gpu": i, "stale": bool(rng.random() < 0.15), "mem_max_mib": mem,
                         "attribution": "outside" if outside else "none"})
    g = pd.DataFrame(rows)
    fresh = g[~g["stale"] & (g["attribution"] != "outside")]
    unread = fresh["mem_max_mib"].isna().groupby(fresh["host"]).all()
    want = sorted(unread.index[unread.to_numpy(dtype=bool)])
    said = sweep.run_warnings(Snapshot(ts=NOW, window_s=900.0, lookback_s=3600.0, source="test", gpus=g),
                              {"warnings": []})
    if not want:
        assert said == []
    elif len(want) == len(unread):
        assert len(said) == 1 and said[0].startswith("no GPU reports framebuffer memory used"), said
    else:
        assert len(said) == 1 and said[0].startswith(f"no GPU of {len(want)} of {len(unread)} host(s) ("), said
        assert all(h in said[0] for h in want[:5]) and not any(h in said[0] for h in sorted(set(g["host"]) - set(want)))
