"""Real serving fleets, generated: the space twenty of them span, and the shipped policy over five.

The generator (``sim-trace --behaviours serving-fleet``, :func:`gpu_cost.sim.cluster.serving_fleet`) is
held to the space of the real fleets (busy 20-60 %, a trickle of traffic, starved replicas, one-day
deployments, one model per set, pods that never computed, finished training that lingers) on twenty
seeds; the replay of the shipped policy in enforce, approvals granted, with the class baselines and
without them, is held to the properties on five of them (:data:`REPLAYED`: the most replicas, the most
pods that never computed and lingering jobs): no replica of a serving set is ever killed, every pod that
never computed and every lingering finished training job is still found. ``python -m
bench.serving_fleet`` replays twenty bigger fleets (144 GPUs) for the figures.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_cost.analyse.replicas import replica_stem
from gpu_cost.cli.commands.simtrace import write_sim_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.core.model import KILL_ACTIONS
from gpu_cost.sim.cluster import SimCluster, generate_scenario, load_scenario
from gpu_cost.sim.replay import replay_files
from tests.fixtures.core import ROOT

END = 1795392000.0
DAY = 86400.0
SEEDS = range(20)
#: the fleets the suite replays (each twice, about 8 s): three with the most replicas (1, 4, 5: 10-11 each;
#: without the replica guard all three have a replica demoted), two with the most pods that never computed
#: and lingering finished jobs (9, 13); the bench replays twenty
REPLAYED = (1, 4, 5, 9, 13)


def fleet(seed: int, nodes: int = 3) -> Any:
    sc = generate_scenario(nodes=nodes, gpus_per_node=8, days=1.0, seed=seed, behaviours="serving-fleet")
    return dataclasses.replace(sc, anchor=END)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_generator_spans_the_space_of_real_fleets(seed: int) -> None:
    sc = fleet(seed)
    cluster = SimCluster(sc, END)
    m = cluster.matrix(END - DAY, END)
    jobs = [j for j in sc.jobs if not j.pending]
    by = {b: [j for j in jobs if j.behaviour == b] for b in ("replica", "never_active", "zombie", "training")}
    assert by["replica"] and by["never_active"] and by["zombie"]
    sets: dict[tuple[str, str], list[Any]] = {}
    for j in by["replica"]:
        sets.setdefault((j.user, replica_stem(j.name)), []).append(j)
    for (owner, stem), members in sets.items():
        assert len({j.mem_share for j in members}) == 1, "one model per set: the same resident memory on every pod"
        assert all(j.start >= -DAY for j in members), "a one-day deployment: no history before the trace"
        busy = [m.util[cluster.job_rows(j)[0], m.times >= END + j.start] > 1.0 for j in members]
        share = float(np.concatenate(busy).mean())  # the set's samples while its pods live
        assert 0.12 <= share <= 0.7, (owner, stem, share)  # busy 20-60 %, give or take the starved and the luck
        if len(members) >= 4:
            starved = [j for j in members if j.quiet_until >= 0.6 * -j.start]
            assert starved, "a few replicas get no traffic for most of their day"
            for j in starved:
                r = cluster.job_rows(j)[0]
                s = int(np.searchsorted(m.times, END + j.start))
                q = int(np.searchsorted(m.times, END + j.start + j.quiet_until))
                assert float(np.max(m.util[r, s:q])) < 1.0 and float(np.max(m.util[r, q:])) > 1.0
    for j in by["never_active"]:
        r = cluster.job_rows(j)[0]
        end = END + (j.end if j.end is not None else 0.0)
        assert end - (END + j.start) >= 1800
        live = (m.times >= END + j.start) & (m.times < end)
        assert float(np.max(m.util[r, live])) < 1.0 and float(np.max(m.mem[r, live])) < 1024
    for j in by["zombie"]:
        r = cluster.job_rows(j)[0]
        after = (m.times >= END + j.end) & (m.times < END + j.end + (j.linger or 0.0))
        assert after.any() and float(np.max(m.util[r, after])) == 0.0 and float(np.min(m.mem[r, after])) > 1024


def test_the_scenario_file_is_a_serving_fleet() -> None:
    sc = load_scenario(ROOT / "include" / "scenarios" / "serving-fleet.yaml")
    assert {j.behaviour for j in sc.jobs} >= {"replica", "never_active", "zombie"}
    assert all(len(j.gpus) == 1 for j in sc.jobs if j.behaviour in ("replica", "never_active"))


@pytest.fixture(scope="module")
def policies() -> tuple[Any, Any]:
    shipped = load_policy(ROOT / "include" / "policy" / "default.yaml")
    alone = dataclasses.replace(shipped, baselines=dataclasses.replace(shipped.baselines, enabled=False))
    object.__setattr__(alone, "source", shipped.source)
    return shipped, alone


@pytest.mark.slow
@pytest.mark.parametrize("seed", REPLAYED)
def test_no_replica_is_killed_and_the_waste_is_still_found(seed: int, tmp_path: Path, policies: tuple[Any, Any]) -> None:
    info = write_sim_trace(tmp_path, days=1.0, gpus=16, seed=seed, end=END, behaviours="serving-fleet")
    import pandas as pd

    jobs = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str})
    replicas = set(jobs.loc[jobs["behaviour"] == "replica", "job_id"])
    for name, policy in zip(("baselines", "without baselines"), policies, strict=True):
        res = replay_files(tmp_path / "samples.parquet", tmp_path / "jobs.csv", policy, mode="enforce",
                           approvals="approve").to_dict()
        killed = {str(a["job_id"]) for a in res["actions"] if a["action"] in KILL_ACTIONS or a["action"] == "demote"}
        assert not killed & replicas, f"seed {seed}, {name}: a replica was demoted or killed"
        assert res["false_kills"] == 0, (seed, name, res["false_kill_targets"])
        beh = res["by_behaviour"]
        for kind in ("never_active", "zombie"):
            row = beh.get(kind, {"jobs": 0, "found": 0})
            assert row["jobs"] == info["behaviours"].get(kind, 0) and row["found"] == row["jobs"], (seed, name, kind)
        assert math.isclose(res["human_asked_count"], len(res["human_asked"]))
