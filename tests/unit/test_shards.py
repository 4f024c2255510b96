"""Shards of the sweep: the findings and decisions of a sharded sweep are the unsharded sweep's."""

from __future__ import annotations

from pathlib import Path

import pytest
from pandas.testing import assert_frame_equal

from gpu_cost.analyse import baselines, replicas
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import load_policy
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.model import Finding, Job, Reservation
from gpu_cost.loop import sweep
from gpu_cost.perceive import shards
from gpu_cost.sim import cluster as sim

NOW = 1_795_960_800.0


def _sweep(policy, scenario, of: int, db: Path, *, generic: bool = False):  # type: ignore[no-untyped-def]
    """Collect, detect and decide as the DAG does with ``of`` shards; return (snapshot, findings, plan)."""
    store = AuditStore(f"sqlite:///{db}").ensure_schema()
    if generic:  # the path of the sources that read the whole cluster: the view is cut from it
        full = sweep.collect(policy, NOW, "sim", scenario=scenario)
        views = [shards.restrict(full, shards.select_in(full, i, of)) for i in range(of)]
    else:
        views = [sweep.collect_shard(policy, NOW, i, of, "sim", scenario=scenario) for i in range(of)]
    for i, view in enumerate(views):
        only = None if of == 1 else shards.of_view(view, i, of).owned_jobs
        baselines.observe(store, view, policy, run_id="run", only=only)
    snap = sweep.merge_shards(views, policy, store)
    logs = sorted(snap.job_logs)
    sets = replicas.replica_sets(snap, policy) if of > 1 else None
    found = shards.merge_findings(sweep.detect_shard(v, policy, i, of, store, log_jobs=logs, replica_sets=sets)
                                  for i, v in enumerate(views))
    return snap, found, sweep.plan(found, snap, policy, store, NOW)


SCENARIOS = {
    "modern": lambda: sim.load_scenario(sim.paths.default_scenario().with_name("modern.yaml")),
    "default": lambda: sim.load_scenario(None),
    "generated-60-nodes": lambda: sim.generate_scenario(nodes=60, gpus_per_node=8, jobs_per_node=2, pending=10,
                                                        seed=3, behaviours="hard"),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS), ids=sorted(SCENARIOS))
@pytest.mark.parametrize("generic", [False, True], ids=["sim-shards", "cut-from-whole"])
def test_sharded_sweep_finds_and_decides_what_the_unsharded_one_does(name, generic, tmp_path) -> None:  # type: ignore[no-untyped-def]
    policy = load_policy()
    scenario = SCENARIOS[name]()
    one, found1, plan1 = _sweep(policy, scenario, 1, tmp_path / "one.db")
    assert found1 and plan1.decisions, "the scenario must give something to find"
    for of in (2, 5, 64):
        snap, found, plan = _sweep(policy, scenario, of, tmp_path / f"{of}.db", generic=generic)
        assert [f.to_dict() for f in found] == [f.to_dict() for f in found1], of
        assert [d.to_dict() for d in plan.decisions] == [d.to_dict() for d in plan1.decisions], of
        assert plan.cap_violation == plan1.cap_violation
        # the run's snapshot: every GPU once, the same jobs and the same job logs
        key = ["host", "gpu"]
        assert_frame_equal(snap.gpus.sort_values(key).reset_index(drop=True),
                           one.gpus.sort_values(key).reset_index(drop=True), check_dtype=False)
        assert sorted(j.job_id for j in snap.jobs) == sorted(j.job_id for j in one.jobs)
        assert sorted(snap.job_logs) == sorted(one.job_logs)
        assert snap.classes == one.classes and one.classes
        assert snap.gpu_count() == one.gpu_count() and snap.degraded == one.degraded


def _job(job_id: str, *hosts: str, state: str = "RUNNING", reservation: str = "") -> Job:
    return Job(job_id=job_id, user="u", state=state, nodes=hosts, gpu_alloc=tuple((h, (0,)) for h in hosts),
               reservation=reservation)


def test_a_job_across_groups_is_judged_by_one_and_seen_whole_by_every_group_touching_it() -> None:
    hosts = [f"n{i:03d}" for i in range(40)]
    of = 4
    wide = _job("1", "n001", "n017", "n033")
    neighbour = _job("2", "n017", "n018")  # shares a node with the wide job
    pending = _job("3", state="PENDING")
    res = Reservation(name="r", start_ts=0, end_ts=1e12, nodes=("n005", "n006"), node_count=2)
    inside = _job("4", "n005", reservation="r")
    # waits for the reservation: its pending job is demand the reservation's group must see
    queued = next(_job(str(i), state="PENDING", reservation="r") for i in range(5, 99)
                  if shards.job_owner(_job(str(i), state="PENDING"), of) != shards.reservation_owner(res, of))
    jobs = [wide, neighbour, pending, inside, queued]
    sels = [shards.select(hosts, jobs, [res], i, of) for i in range(of)]
    # each node is some group's own, exactly once; each job and reservation is judged by exactly one group
    assert sorted(h for s in sels for h in s.own) == hosts
    assert sorted(j for s in sels for j in s.owned_jobs) == ["1", "2", "4"]
    assert [s.shard for s in sels if "r" in s.owned_reservations] == [shards.reservation_owner(res, of)]
    # a pending job is in its own group's view alone, not every group's (the queue would be carried 16 times)
    assert [s.shard for s in sels if "3" in s.jobs] == [shards.job_owner(pending, of)]
    assert sorted(s.shard for s in sels if queued.job_id in s.jobs) == sorted(
        {shards.job_owner(queued, of), shards.reservation_owner(res, of)})
    for s in sels:
        for job in (wide, neighbour, inside):
            if job.job_id in s.owned_jobs or shards.job_hosts(job) & s.own:
                assert job.job_id in s.jobs and shards.job_hosts(job) <= s.hosts, (s.shard, job.job_id)
        if "1" in s.owned_jobs:  # whether the wide job is alone on its nodes depends on its neighbour
            assert "2" in s.jobs and {"n017", "n018"} <= s.hosts
        if "r" in s.owned_reservations:
            assert {"n005", "n006"} <= s.hosts and "4" in s.jobs and queued.job_id in s.jobs


def test_each_finding_is_kept_by_exactly_one_group() -> None:
    hosts = [f"n{i:03d}" for i in range(20)]
    jobs = [_job("7", "n002", "n011")]
    res = Reservation(name="idle", start_ts=0, end_ts=1e12, nodes=("n004",), node_count=1)
    findings = [
        Finding(rule="idle_allocation", target_kind="job", target="job:7", action="notify", gpus=2, job_id="7"),
        Finding(rule="zombie", target_kind="process", target="proc:n009:1:2", action="notify", gpus=1, host="n009"),
        Finding(rule="zombie", target_kind="gpu", target="gpu:n013:0", action="notify", gpus=1, host="n013"),
        Finding(rule="idle_reservation", target_kind="reservation", target="reservation:idle",
                action="release_reservation", gpus=8),
    ]
    of = 3
    kept = [f for i in range(of) for f in shards.owned(findings, shards.select(hosts, jobs, [res], i, of))]
    assert sorted(f.target for f in kept) == sorted(f.target for f in findings)
    orphan = Finding(rule="x", target_kind="gpu", target="gpu:?", action="notify", gpus=1)
    with pytest.raises(GpuCostError, match="names no host"):
        shards.owned([orphan], shards.select(hosts, jobs, [res], 0, of))


@pytest.mark.parametrize(("shard", "of"), [(0, 0), (3, 3), (-1, 2), (0, 1025)], ids=["none", "past", "negative", "over"])
def test_bad_shard_numbers_are_refused(shard: int, of: int) -> None:
    with pytest.raises(GpuCostError, match="shards"):
        shards.check(shard, of)


def test_node_groups_are_stable_and_spread() -> None:
    names = [f"gpu-{i:05d}" for i in range(12_500)]
    groups = [shards.shard_of(n, 16) for n in names]
    assert groups == [shards.shard_of(n, 16) for n in names]
    sizes = [groups.count(g) for g in range(16)]
    assert min(sizes) > 0.8 * len(names) / 16 and max(sizes) < 1.2 * len(names) / 16, sizes
    assert {shards.shard_of(n, 1) for n in names} == {0}


def _multi_node_trace() -> tuple[object, object]:
    """Samples and jobs of 12 nodes × 4 GPUs over 6 h with jobs across nodes that land in different groups."""
    import numpy as np
    import pandas as pd

    hosts = [f"h{i:02d}" for i in range(12)]
    times = np.arange(NOW - 6 * 3600 + 60, NOW + 1, 60)
    start = NOW - 5 * 3600
    jobs = [
        # (id, gpus, util% per host: a job idle on every node, one idle on one node only, one working poorly)
        ("101", {"h00": (0, 1), "h05": (0, 1), "h09": (0,)}, {"h00": 0, "h05": 0, "h09": 0}),
        ("102", {"h01": (0, 1), "h02": (0, 1)}, {"h01": 0, "h02": 90}),
        ("103", {"h03": (0,), "h07": (0, 1, 2)}, {"h03": 12, "h07": 12}),
        ("104", {"h04": (0, 1, 2, 3)}, {"h04": 95}),
        ("105", {"h06": (0, 1), "h10": (2, 3), "h11": (0,)}, {"h06": 0, "h10": 0, "h11": 0}),
        ("106", {"h06": (2, 3), "h08": (0,)}, {"h06": 80, "h08": 80}),  # shares h06 with 105
    ]
    rows = []
    held = {(h, g): (jid, util[h]) for jid, alloc, util in jobs for h, gs in alloc.items() for g in gs}
    for h in hosts:
        for g in range(4):
            jid, util = held.get((h, g), ("", 0))
            mem = 30_000.0 if jid else (8_000.0 if (h, g) == ("h11", 3) else 0.0)  # h11:3: memory held, no job
            for t in times:
                running = bool(jid) and t > start
                rows.append((t, h, g, float(util if running else 0), mem if running or not jid else 0.0,
                             jid if running else ""))
    samples = pd.DataFrame(rows, columns=["ts", "host", "gpu", "util", "mem_used_mib", "job_id"])
    table = pd.DataFrame([
        {"job_id": jid, "user": f"user{jid}", "start_ts": start, "account": "lab", "partition": "gpu",
         "time_limit_s": 86400.0, "gpu_ids": ",".join(f"{h}:{g}" for h, gs in alloc.items() for g in gs)}
        for jid, alloc, _ in jobs
    ])
    return samples, table


def test_jobs_across_node_groups_are_found_as_one_sweep_finds_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The sources that read the whole cluster (a trace here, Prometheus alike) cut each group's view from it."""
    policy = load_policy()
    samples, jobs = _multi_node_trace()
    whole = sweep.collect(policy, NOW, "trace", samples=samples, jobs=jobs)
    store1 = AuditStore(f"sqlite:///{tmp_path / 'one.db'}").ensure_schema()
    baselines.observe(store1, whole, policy, run_id="run")
    found1 = sweep.detect(whole, policy)
    plan1 = sweep.plan(found1, whole, policy, store1, NOW)
    targets = {(f.rule, f.target) for f in found1}
    assert {("idle_allocation", "job:101"), ("idle_allocation", "job:105")} <= targets
    assert ("idle_allocation", "job:102") not in targets  # busy on one of its nodes
    assert any(t == "job:103" for _, t in targets) and any(t.startswith("gpu:h11:3") for _, t in targets)
    for of in (2, 3, 4, 7, 12):
        owners = {shards.job_owner(j, of) for j in whole.running_jobs() if len(shards.job_hosts(j)) > 1}
        views = [sweep.collect_shard(policy, NOW, i, of, "trace", samples=samples, jobs=jobs) for i in range(of)]
        store = AuditStore(f"sqlite:///{tmp_path / f'{of}.db'}").ensure_schema()
        for i, view in enumerate(views):  # as the DAG's collect: each group records the jobs it judges
            baselines.observe(store, view, policy, run_id="run", only=shards.of_view(view, i, of).owned_jobs)
        found = shards.merge_findings(sweep.detect_shard(v, policy, i, of, store) for i, v in enumerate(views))
        assert [f.to_dict() for f in found] == [f.to_dict() for f in found1], of
        plan = sweep.plan(found, sweep.merge_shards(views, policy), policy, store, NOW)
        assert [d.to_dict() for d in plan.decisions] == [d.to_dict() for d in plan1.decisions], of
        if of >= 3:
            assert len(owners) > 1, "the multi-node jobs should be judged by different groups"


def test_a_reservation_with_a_job_waiting_in_it_is_judged_by_its_group_as_one_sweep_judges_it() -> None:
    """A pending job is only in its own group's view, and in the view of the group judging its reservation:
    a reservation whose demand waits in the queue is not idle, whichever group the waiting job belongs to."""
    import dataclasses

    policy = load_policy()
    full = sweep.collect(policy, NOW, "sim", scenario=sim.generate_scenario(
        nodes=200, gpus_per_node=8, jobs_per_node=0.5, pending=0, seed=5))
    busy = {h for j in full.running_jobs() for h in shards.job_hosts(j)}
    free = sorted({n.name for n in full.nodes} - busy)
    assert len(free) >= 12, "the scenario must leave idle nodes to reserve"
    of = 5
    reservations = [Reservation(name=f"res{i}", start_ts=NOW - 86400, end_ts=NOW + 86400, nodes=(free[i],), node_count=1)
                    for i in range(12)]
    # half of them have a job waiting: each in a group other than the reservation's
    waiting = []
    for r in reservations[::2]:
        job = next(j for i in range(1000, 2000)
                   if shards.job_owner(j := Job(job_id=str(i), user="u", state="PENDING", reservation=r.name), of)
                   != shards.reservation_owner(r, of) and str(i) not in {w.job_id for w in waiting})
        waiting.append(job)

    def idle(findings: list[Finding]) -> list[str]:
        return sorted(f.target for f in findings if f.rule == "idle_reservation")

    unused = idle(sweep.detect(dataclasses.replace(full, reservations=tuple(reservations)), policy))
    full = dataclasses.replace(full, reservations=tuple(reservations), jobs=(*full.jobs, *waiting))
    whole = idle(sweep.detect(full, policy))
    held = {f"reservation:{r.name}" for r in reservations[::2]}
    assert len(held & set(unused)) >= 3 and len(set(unused) - held) >= 3, unused
    assert whole == sorted(set(unused) - held), "a job waiting in a reservation keeps it from being idle"
    parts = []
    for i in range(of):
        sel = shards.select_in(full, i, of)
        parts.append(shards.owned(sweep.detect(shards.restrict(full, sel), policy), sel))
        assert sum(1 for j in shards.restrict(full, sel).jobs if j.pending) < len(waiting), "the queue is not every group's"
    assert idle([f for p in parts for f in p]) == whole
    merged = shards.merge([(shards.select_in(full, i, of), shards.restrict(full, shards.select_in(full, i, of)))
                           for i in range(of)])
    assert sorted(j.job_id for j in merged.jobs) == sorted(j.job_id for j in full.jobs)
