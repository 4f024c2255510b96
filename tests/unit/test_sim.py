from __future__ import annotations

import numpy as np
import pytest

from gpu_cost.core.errors import ScenarioError
from gpu_cost.sim.cluster import SimCluster, generate_scenario, load_scenario, scenario_from_dict
from tests.fixtures.core import NOW


def test_samples_are_deterministic_and_range_independent(scenario) -> None:  # type: ignore[no-untyped-def]
    c = SimCluster(scenario, anchor=NOW)
    a = c.samples(NOW - 3600, NOW)
    b = c.samples(NOW - 7200, NOW)
    tail = b[b["ts"] > NOW - 3600].reset_index(drop=True)
    assert a.equals(tail)
    assert list(a.columns[:5]) == ["ts", "host", "gpu", "util", "mem_used_mib"]
    assert a["util"].between(0, 100).all()
    c2 = SimCluster(load_scenario(scenario.source), anchor=NOW)
    assert a.equals(c2.samples(NOW - 3600, NOW))


def test_anchor_day_keeps_jobs_stable_through_the_day(scenario) -> None:  # type: ignore[no-untyped-def]
    morning = {j.job_id: j.start_ts for j in SimCluster(scenario, anchor=NOW).jobs_at(NOW)}
    later = {j.job_id: j.start_ts for j in SimCluster(scenario, anchor=NOW + 3600).jobs_at(NOW + 3600)}
    assert morning["1001"] == later["1001"]


def test_zombie_process_is_orphan(scenario) -> None:  # type: ignore[no-untyped-def]
    c = SimCluster(scenario, anchor=NOW)
    procs = c.processes_at(NOW)
    bob = [p for p in procs if p.user == "bob"]
    assert bob and all(p.job_id is None for p in bob)
    assert {j.job_id for j in c.jobs_at(NOW)} >= {"1001", "1003", "1008"}
    assert "1002" not in {j.job_id for j in c.jobs_at(NOW)}


def test_pending_and_labels(scenario) -> None:  # type: ignore[no-untyped-def]
    jobs = {j.job_id: j for j in SimCluster(scenario, anchor=NOW).jobs_at(NOW)}
    assert jobs["1008"].pending and jobs["1008"].gpus_requested == 8
    assert jobs["1007"].labels == ("no-interrupt",)


@pytest.mark.parametrize(
    ("data", "msg"),
    [
        ({"nodes": []}, "no nodes"),
        ({"nodes": [{"name": "a"}], "jobs": [{"job_id": 1, "user": "u", "behaviour": "dancing", "node": "a", "gpus": [0], "start": "-1h"}]}, "behaviour 'dancing'"),
        ({"nodes": [{"name": "a", "gpus": 2}], "jobs": [{"job_id": 1, "user": "u", "behaviour": "idle", "node": "a", "gpus": [5], "start": "-1h"}]}, "do not fit"),
        ({"nodes": [{"name": "a"}], "jobs": [{"job_id": 1, "user": "u", "behaviour": "idle", "node": "b", "gpus": [0], "start": "-1h"}]}, "node 'b'"),
        ({"nodes": [{"name": "a"}], "color": 1}, "unknown keys"),
    ],
    ids=["no-nodes", "behaviour", "gpus", "node", "unknown-key"],
)
def test_bad_scenarios(data, msg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ScenarioError, match=msg):
        scenario_from_dict(data, "s.yaml")


def test_generated_cluster_sizes() -> None:
    sc = generate_scenario(nodes=10, gpus_per_node=8, seed=1)
    c = SimCluster(sc, anchor=NOW)
    assert sc.gpu_count == 80
    running = [j for j in c.jobs_at(NOW) if j.running]
    assert 10 <= len(running) <= 20
    m = c.matrix(NOW - 3600, NOW)
    assert m.util.shape == (80, 60) and not np.isnan(m.util).any()
    week = generate_scenario(nodes=4, days=2, seed=2)
    trace = SimCluster(week, anchor=NOW).jobs_trace(NOW - 2 * 86400, NOW)
    assert len(trace) > 4 and set(trace["behaviour"]) <= {"training", "idle", "zombie", "dataloader", "inference", "memleak"}


def test_a_scenario_written_out_loads_back_as_the_same_cluster() -> None:
    import yaml

    from gpu_cost.sim.cluster import scenario_from_dict, scenario_to_dict
    from gpu_cost.sim.week import demo_scenario

    sc = demo_scenario(1795910400.0)
    back = scenario_from_dict(yaml.safe_load(yaml.safe_dump(scenario_to_dict(sc))))
    assert back.nodes == sc.nodes and back.anchor == sc.anchor == 1795910400.0
    # a job without an end ends at its time limit once loaded: compare the loaded form
    again = scenario_from_dict(scenario_to_dict(back))
    assert again.jobs == back.jobs and len(back.jobs) == len(sc.jobs)
    assert {j.job_id for j in back.jobs} >= {"1001", "1003", "1008"} and {"gpu01", "n00000"} <= {n.name for n in back.nodes}
