"""Every behaviour of the simulator classified right by the rules, and missing data never idle."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpu_cost.analyse.rules import run_rules
from gpu_cost.config.schema import Policy
from gpu_cost.perceive.snapshot import from_matrix
from gpu_cost.sim.cluster import SimCluster, scenario_from_dict
from tests.fixtures.core import NOW

NODE = {"name": "g1", "gpus": 4, "model": "a100", "mem_total_mib": 40960}


def one_job(**job) -> dict:  # type: ignore[no-untyped-def]
    base = {"job_id": "1", "user": "u", "account": "acct", "node": "g1", "gpus": [0, 1], "start": "-3h", "name": "train"}
    base.update(job)
    return {"seed": 3, "anchor": "now", "nodes": [NODE], "jobs": [base]}


def findings_for(data: dict, policy: Policy | None = None, drop=None):  # type: ignore[no-untyped-def]
    policy = policy or Policy()
    sc = scenario_from_dict(data)
    cluster = SimCluster(sc, anchor=NOW)
    m = cluster.matrix(NOW - policy.sweep.lookback, NOW)
    util, mem = m.util.copy(), m.mem.copy()
    if drop is not None:
        drop(util, mem, m.times)
    snap = from_matrix(policy=policy, now=NOW, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids, models=m.models,
                       mem_total=m.mem_total, times=m.times, util=util, mem=mem, power=m.power, job=m.job,
                       jobs=cluster.jobs_at(NOW), processes=cluster.processes_at(NOW), nodes=cluster.nodes_at(NOW))
    return run_rules(snap, policy)


def by_rule(findings):  # type: ignore[no-untyped-def]
    return {(f.rule, f.target.split(":")[0]) for f in findings}


def test_training_is_not_flagged() -> None:
    assert findings_for(one_job(behaviour="training")) == []


def test_zombie_process_is_flagged_with_its_pid() -> None:
    fs = findings_for(one_job(behaviour="zombie", start="-4h", end="-1h"))
    assert [(f.rule, f.target_kind, f.action) for f in fs] == [("zombie", "process", "kill_process")]
    f = fs[0]
    assert f.gpus == 2 and f.user == "u" and f.evidence["pid"] > 0 and f.evidence["mem_min_mib"] > 1024


def test_zombie_needs_the_whole_window() -> None:
    # the job ended 10 minutes ago: its last busy minutes are still in the 15-minute window
    assert findings_for(one_job(behaviour="zombie", start="-4h", end="-10m")) == []


def test_idle_allocation_is_flagged() -> None:
    fs = findings_for(one_job(behaviour="idle", busy_first="30m"))
    assert [(f.rule, f.target, f.action, f.inference) for f in fs] == [("idle_allocation", "job:1", "cancel", False)]
    assert fs[0].gpus == 2 and fs[0].evidence["util_max"] < 5


def test_young_idle_job_gets_grace() -> None:
    assert findings_for(one_job(behaviour="idle", start="-10m")) == []


def test_dataloader_bound_is_low_efficiency_only() -> None:
    fs = findings_for(one_job(behaviour="dataloader"))
    assert [(f.rule, f.action) for f in fs] == [("low_efficiency", "advise")]
    assert fs[0].evidence["util_mean"] < 20


def test_inference_by_behaviour_is_never_killed_or_zombie() -> None:
    # idle for the last 25 minutes, with bursts every 90 minutes before that
    fs = findings_for(one_job(behaviour="inference", name="chat-backend", start="-7h", burst_every="90m", burst_length="15m"))
    rules = {f.rule for f in fs}
    assert "zombie" not in rules
    idle = [f for f in fs if f.rule == "idle_allocation"]
    assert idle and all(f.inference and f.action == "advise" for f in idle)
    assert idle[0].evidence["bursts_lookback"] >= 2


def test_inference_declared_by_name_without_bursts() -> None:
    fs = findings_for(one_job(behaviour="idle", name="vllm-serve-7b", busy_first="10m"))
    assert [(f.rule, f.inference, f.action) for f in fs] == [("idle_allocation", True, "advise")]
    assert "name matches" in fs[0].evidence["inference"]


def test_memleak_is_not_waste() -> None:
    assert findings_for(one_job(behaviour="memleak", start="-2h")) == []


def test_missing_samples_never_count_as_idle() -> None:
    def drop_recent(util, mem, times):  # type: ignore[no-untyped-def]
        recent = times > NOW - 600
        util[:, recent] = np.nan
        mem[:, recent] = np.nan

    assert findings_for(one_job(behaviour="idle", busy_first="30m"), drop=drop_recent) == []
    assert findings_for(one_job(behaviour="zombie", start="-4h", end="-1h"), drop=drop_recent) == []


def test_impossible_values_are_not_idle() -> None:
    def corrupt(util, mem, times):  # type: ignore[no-untyped-def]
        util[:, times > NOW - 900] = -1.0  # an exporter answering nonsense

    assert findings_for(one_job(behaviour="idle", busy_first="30m"), drop=corrupt) == []


def test_one_stale_gpu_saves_the_whole_job() -> None:
    def drop_one(util, mem, times):  # type: ignore[no-untyped-def]
        util[1, times > NOW - 900] = np.nan

    assert findings_for(one_job(behaviour="idle", busy_first="30m"), drop=drop_one) == []


def test_disabled_rule_finds_nothing() -> None:
    p = Policy()
    p = dataclasses.replace(p, rules=p.rules.replace(idle_allocation=dataclasses.replace(p.rules.idle_allocation, enabled=False)))
    assert findings_for(one_job(behaviour="idle", busy_first="30m"), policy=p) == []


@pytest.mark.parametrize("util_max", [0.1, 5.0])
def test_threshold_comes_from_policy(util_max: float) -> None:
    p = Policy()
    p = dataclasses.replace(p, rules=p.rules.replace(idle_allocation=dataclasses.replace(p.rules.idle_allocation, util_max=util_max)))
    fs = findings_for(one_job(behaviour="idle", busy_first="30m"), policy=p)
    # idle GPUs report 0-0.4 % noise: a 0.1 % threshold sees activity, 5 % sees idleness
    assert any(f.rule == "idle_allocation" for f in fs) is (util_max == 5.0)


def test_default_scenario_has_every_kind(policy, scenario) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.sim import cluster as sim

    snap = sim.snapshot(policy, NOW, scenario)
    fs = run_rules(snap, policy)
    kinds = {(f.rule, f.job_id if f.target_kind == "job" else f.user) for f in fs}
    assert ("zombie", "bob") in kinds
    assert ("idle_allocation", "1003") in kinds
    assert ("low_efficiency", "1004") in kinds
    inference = [f for f in fs if f.job_id == "1005"]
    assert inference and all(f.inference and f.action == "advise" for f in inference)
    assert not any(f.rule == "zombie" and f.job_id == "1005" for f in fs)


@pytest.mark.parametrize(("name", "patterns", "why"), [
    ("Serve-LLaMA", ("train-*", "serve-*", "*llama*"), "name matches serve-*"),  # the first glob that names it
    ("eval[1]", ("eval[[]1]",), "name matches eval[[]1]"),  # glob brackets, not regex ones
    ("a.b", ("a?b",), "name matches a?b"),
    ("axb", ("a.b",), None),  # a dot is a dot
    ("train-7", ("serve-*", "*-inference"), None),
    ("serve", (), None),
    ("", ("*",), None),  # no name: nothing to match
])
def test_declared_by_name_globs_case_insensitive_first_match(name: str, patterns: tuple[str, ...],
                                                             why: str | None) -> None:
    from gpu_cost.analyse.rules.common import declared
    from gpu_cost.core.model import Job

    job = Job(job_id="1", user="u", account="a", partition="batch", state="RUNNING", name=name)
    assert declared(job, ("serving",), patterns, ()) == why
    assert declared(dataclasses.replace(job, partition="serving"), ("serving",), patterns, ()) == "partition serving"
