"""The anomaly rule: a steady framebuffer leak, or a run far longer than its class's without progress — advice only."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from gpu_cost.analyse.rules import run_rules
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import Policy
from gpu_cost.core import registry
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.model import Job, Node
from gpu_cost.perceive.snapshot import from_matrix
from tests.fixtures.core import NOW

STEP = 60.0
LOOKBACK = Policy().sweep.lookback  # 6 h
TIMES = np.arange(NOW - LOOKBACK + STEP, NOW + 1, STEP)
HOURS = (TIMES - TIMES[0]) / 3600.0
TOTAL = 81920.0
CLASS = {"key": "user=u|account=a|partition=batch|name=train-#|gpus=2", "members": 5, "kind": "training",
         "runtime_p90_s": 3.5 * 3600.0, "runtime_p50_s": 3 * 3600.0}


def job(start_h: float = 8.0, gpus: tuple[int, ...] = (0, 1), **kw: Any) -> Job:
    base: dict[str, Any] = {"job_id": "1", "user": "u", "account": "a", "partition": "batch", "name": "train-7",
                            "start_ts": NOW - start_h * 3600, "gpu_alloc": (("g1", gpus),), "nodes": ("g1",)}
    base.update(kw)
    return Job(**base)


def snap(mem: np.ndarray, *, util: float | np.ndarray = 85.0, power: float | np.ndarray = 300.0, jobs: tuple[Job, ...] = (),
         classes: dict[str, Any] | None = None, logs: dict[str, Any] | None = None, policy: Policy | None = None,
         drop_recent: tuple[int, ...] = (), cpu: float | None = None):  # type: ignore[no-untyped-def]
    """A snapshot of one node's GPUs from a GPU × time memory matrix (the rule tests' way: from_matrix)."""
    policy = policy or Policy()
    mem = np.array(np.atleast_2d(mem), dtype=float)
    n = len(mem)
    u = np.broadcast_to(np.asarray(util, dtype=float), mem.shape).copy()
    p = np.broadcast_to(np.asarray(power, dtype=float), mem.shape).copy()
    for row in drop_recent:  # the exporter stopped answering for this GPU 10 minutes ago
        u[row, TIMES > NOW - 600] = np.nan
        mem[row, TIMES > NOW - 600] = np.nan
    s = from_matrix(
        policy=policy, now=NOW, source="test", hosts=np.array(["g1"] * n, dtype=object), gpus=np.arange(n),
        uuids=np.array([f"GPU-{i}" for i in range(n)], dtype=object), models=np.array(["a100"] * n, dtype=object),
        mem_total=np.full(n, TOTAL), times=TIMES, util=u, mem=mem, power=p,
        job=np.full(mem.shape, "", dtype=object), jobs=jobs or (job(gpus=tuple(range(n))),), processes=(),
        nodes=(Node("g1", state="mixed", gpus_total=n, gpus_alloc=n, cpu_util=cpu),),
    )
    s.classes = dict(classes or {})
    s.job_logs = dict(logs or {})
    return s


def anomalies(s, policy: Policy | None = None):  # type: ignore[no-untyped-def]
    return run_rules(s, policy or Policy(), names=["anomaly"])


def leaking(rate_mib_h: float = 2048.0, gpus: int = 2, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    flat = 30000 + rng.normal(0, 150, (gpus, len(TIMES)))
    flat[0] = 10000 + rate_mib_h * HOURS + rng.normal(0, 300, len(TIMES))  # GPU 0 leaks, noisily
    return flat


def flat(gpus: int = 2, seed: int = 2) -> np.ndarray:
    return 30000 + np.random.default_rng(seed).normal(0, 150, (gpus, len(TIMES)))


# -- leak --------------------------------------------------------------------------------------


def test_a_leak_is_found_with_its_slope() -> None:
    s = snap(leaking())
    assert abs(s.gpus["mem_slope_mib_h_lb"].iloc[0] - 2048) < 0.05 * 2048  # the frame measures it within 5 %
    fs = anomalies(s)
    assert [(f.rule, f.target, f.action, f.target_kind) for f in fs] == [("anomaly", "job:1", "advise", "job")]
    ev = fs[0].evidence
    assert ev["anomaly"] == "leak" and ev["anomalies"] == ["leak"]
    assert abs(ev["slope_mib_per_h"] - 2048) < 0.05 * 2048 and ev["r2"] >= 0.9
    assert ev["span_s"] >= 3 * 3600 and ev["gpu"] == "g1:0" and ev["leaking_gpus"] == ["g1:0"]
    assert ev["mem_total_mib"] == TOTAL and 20000 < ev["mem_now_mib"] < 24000
    # (81920 - ~22300 MiB) / 2048 MiB/h: about 29 hours to go
    assert 25 < ev["hours_to_full"] < 33
    assert 0 < ev["confidence"] <= 1 and all(set(x) == {"what", "value", "counted"} for x in ev["signals"])
    assert any(x["what"] == "Fit R²" for x in ev["signals"])
    text = registry.why(fs[0])
    assert text.startswith("job 1: GPU memory grew 2.0 GiB/h for 6 h (R² 0.9") and text.endswith("a leak?")


def test_a_fast_leak_near_full_is_more_certain() -> None:
    slow = anomalies(snap(leaking(1500)))[0].evidence
    fast = anomalies(snap(leaking(8000)))[0].evidence  # 10 GB + 48 GB in 6 h: full within hours
    assert fast["hours_to_full"] < 24 < slow["hours_to_full"]
    assert fast["confidence"] > slow["confidence"]


@pytest.mark.parametrize("shape", ["flat", "sawtooth", "slow", "step"])
def test_no_leak_without_steady_growth(shape: str) -> None:
    mem = flat()
    if shape == "sawtooth":  # checkpointing: a buffer filled over an hour, then freed
        mem[0] = 30000 + 8192 * np.mod(HOURS, 1.0)
    elif shape == "slow":  # steady, but under leak_min_mib_per_h
        mem[0] = 30000 + 500 * HOURS
    elif shape == "step":  # a model loaded once halfway through
        mem[0] = np.where(HOURS > 3, 60000.0, 20000.0)
    s = snap(mem)
    if shape == "sawtooth":
        assert s.gpus["mem_r2_lb"].iloc[0] < 0.1
    assert anomalies(s) == []


def test_thresholds_come_from_the_policy() -> None:
    s = snap(leaking(2048))
    p = Policy()
    strict = dataclasses.replace(p, rules=p.rules.replace(anomaly=dataclasses.replace(
        p.rules.anomaly, leak_min_mib_per_h=4096.0)))
    assert anomalies(s, strict) == []
    long_span = dataclasses.replace(p, rules=p.rules.replace(anomaly=dataclasses.replace(
        p.rules.anomaly, leak_min_span=7 * 3600.0)))
    assert anomalies(s, long_span) == []  # 6 h of lookback never spans 7 h
    off = dataclasses.replace(p, rules=p.rules.replace(anomaly=dataclasses.replace(p.rules.anomaly, enabled=False)))
    assert anomalies(s, off) == []


def test_a_job_younger_than_the_span_is_not_judged_on_the_gpus_past() -> None:
    assert anomalies(snap(leaking(), jobs=(job(start_h=2.0),))) == []


def test_stale_gpus_never_produce_findings() -> None:
    # the leaking GPU went silent ten minutes ago: its lookback still shows the leak
    s = snap(leaking(), drop_recent=(0,))
    assert s.gpus["stale"].iloc[0] and s.gpus["mem_slope_mib_h_lb"].iloc[0] > 1024
    assert anomalies(s) == []
    # the other GPU of the job is the stale one: no data, no finding for the job either
    assert anomalies(snap(leaking(), drop_recent=(1,))) == []
    # nor an overrun whose GPUs are stale
    idle = snap(flat(), util=0.5, power=60.0, classes={"1": CLASS}, drop_recent=(0, 1))
    assert anomalies(idle) == []


def test_a_gpu_of_no_running_job_is_not_a_finding() -> None:
    other = Job("9", "v", start_ts=NOW - 8 * 3600, gpu_alloc=(("g7", (0,)),))
    assert anomalies(snap(leaking(), jobs=(other,))) == []


def test_an_older_snapshot_without_the_trend_columns_finds_no_leak() -> None:
    s = snap(leaking())
    s.gpus = s.gpus.drop(columns=["mem_slope_mib_h_lb", "mem_r2_lb", "mem_span_s_lb"])
    assert anomalies(s) == []


# -- advice only -------------------------------------------------------------------------------


def test_advice_only_the_loader_refuses_a_destructive_ladder() -> None:
    spec = registry.rule("anomaly")
    assert spec is not None and spec.advice_only and spec.target == "job"
    allowed = registry.rule_actions("anomaly")
    assert "advise" in allowed and not allowed & set(registry.names(destructive=True))
    for bad in ("cancel", "demote", "kill", "terminate"):
        with pytest.raises(PolicyError, match=f"'{bad}' is not possible for anomaly"):
            parse_policy(f"rules:\n  anomaly:\n    ladder: [{{action: advise}}, {{action: {bad}, after: 1h}}]\n")
    p = parse_policy("rules:\n  anomaly:\n    ladder: [{action: advise}, {action: notify_manager, after: 1d}]\n")
    assert [r.action for r in p.rules.anomaly.ladder] == ["advise", "notify_manager"]


# -- overrun -----------------------------------------------------------------------------------


def idle_overrun(**kw: Any):  # type: ignore[no-untyped-def]
    args: dict[str, Any] = {"util": 0.5, "power": 60.0, "classes": {"1": CLASS}}
    args.update(kw)
    return snap(flat(), **args)


def test_an_overrun_without_progress_is_found() -> None:
    fs = anomalies(idle_overrun())  # 8 h against a p90 of 3.5 h, GPUs idle, no log
    assert [(f.rule, f.target, f.action) for f in fs] == [("anomaly", "job:1", "advise")]
    ev = fs[0].evidence
    assert ev["anomalies"] == ["overrun"] and ev["runtime_s"] == 8 * 3600 and ev["class_p90_s"] == 3.5 * 3600
    assert ev["overrun_factor"] == 2.0 and ev["runtime_ratio"] == 2.29
    assert ev["class_key"] == CLASS["key"] and ev["class_members"] == 5
    assert 0 < ev["confidence"] <= 1 and {x["what"] for x in ev["signals"]} >= {"Runtime", "Class", "GPU power"}
    assert "with no sign of progress" in registry.why(fs[0]) and "(5 jobs)" in registry.why(fs[0])


def test_a_finished_log_makes_an_overrun_more_certain() -> None:
    quiet = anomalies(idle_overrun())[0].evidence["confidence"]
    done = anomalies(idle_overrun(logs={"1": {"text": "epoch 9\nTraining finished\n", "mtime": NOW - 5 * 3600}}))
    assert done[0].evidence["log_state"] == "finished" and done[0].evidence["confidence"] > quiet


@pytest.mark.parametrize("members", [1, 2])
def test_an_overrun_needs_a_class_of_min_members(members: int) -> None:
    assert anomalies(idle_overrun(classes={"1": {**CLASS, "members": members}})) == []


def test_min_members_comes_from_the_policy() -> None:
    p = Policy()
    p = dataclasses.replace(p, baselines=dataclasses.replace(p.baselines, min_members=6))
    assert anomalies(idle_overrun(), p) == []
    p = dataclasses.replace(p, baselines=dataclasses.replace(p.baselines, min_members=5))
    assert len(anomalies(idle_overrun(), p)) == 1


@pytest.mark.parametrize("klass", [
    {**CLASS, "kind": "service"},
    {**CLASS, "member_kind": "service"},
    {**CLASS, "runtime_p90_s": None},
    {**CLASS, "runtime_p90_s": 4 * 3600.0},  # 8 h is not above 2 × 4 h
])
def test_no_overrun_for_services_or_without_a_p90_or_within_it(klass: dict[str, Any]) -> None:
    assert anomalies(idle_overrun(classes={"1": klass})) == []


def test_no_overrun_without_a_class() -> None:
    assert anomalies(idle_overrun(classes={})) == []


@pytest.mark.parametrize("progress", ["log", "power", "util", "cpu"])
def test_no_overrun_while_the_job_progresses(progress: str) -> None:
    kw: dict[str, Any] = {}
    if progress == "log":  # written a minute ago, no crash or finish
        kw["logs"] = {"1": {"text": "step 91000 loss 1.93\n", "mtime": NOW - 60}}
    elif progress == "power":
        kw["power"] = 250.0
    elif progress == "util":  # busy GPUs, no power reading at all
        kw.update(util=90.0, power=np.nan)
    else:  # the node's CPU busy: a data-loading phase
        kw["cpu"] = 95.0
    assert anomalies(idle_overrun(**kw)) == []


def test_a_log_just_written_with_a_crash_is_no_progress() -> None:
    crashed = {"1": {"text": "Traceback (most recent call last)\nRuntimeError: CUDA out of memory\n", "mtime": NOW - 30}}
    fs = anomalies(idle_overrun(logs=crashed))
    assert len(fs) == 1 and fs[0].evidence["log_state"] == "crashed"


def test_declared_inference_never_overruns() -> None:
    assert anomalies(idle_overrun(jobs=(job(name="vllm-serve-7b"),))) == []


def test_leak_and_overrun_in_one_finding() -> None:
    fs = anomalies(snap(leaking(), util=0.5, power=60.0, classes={"1": CLASS}))
    assert len(fs) == 1 and fs[0].evidence["anomalies"] == ["leak", "overrun"]
    text = registry.why(fs[0])
    assert "a leak?" in text and "stuck?" in text


# -- CPU/GPU mix -----------------------------------------------------------------------------------

MIXED = {**CLASS, "cpu_pct_active": 20.0, "cpu_members": 5}


@pytest.mark.parametrize("cpu,found", [(90.0, True), (5.0, True), (25.0, False), (50.0, False)])
def test_a_cpu_gpu_mix_unlike_the_class_is_advised(cpu: float, found: bool) -> None:
    fs = anomalies(snap(flat(), cpu=cpu, classes={"1": MIXED}))
    assert bool(fs) == found
    if found:
        f = fs[0]
        assert f.action == "advise" and "mix" in f.evidence["anomalies"]
        assert f.evidence["class_cpu_pct"] == 20.0 and f.evidence["cpu_pct"] == cpu
        assert any(s["what"] == "CPU/GPU mix" for s in f.evidence["signals"])
        assert "unusual CPU/GPU mix" in registry.why(f)


def test_no_mix_finding_without_enough_class_cpu_data_or_a_node_to_itself() -> None:
    assert anomalies(snap(flat(), cpu=90.0, classes={"1": {**MIXED, "cpu_members": 2}})) == []
    assert anomalies(snap(flat(), cpu=90.0, classes={"1": {**MIXED, "cpu_pct_active": None}})) == []
    assert anomalies(snap(flat(), cpu=None, classes={"1": MIXED})) == []
    other = job(job_id="2", gpus=(1,))
    shared = snap(flat(), cpu=90.0, classes={"1": MIXED}, jobs=(job(gpus=(0,)), other))
    assert not [f for f in anomalies(shared) if "mix" in f.evidence.get("anomalies", ())]


def test_no_mix_finding_while_the_gpus_rest_or_for_a_service() -> None:
    resting = anomalies(snap(flat(), util=0.5, power=60.0, cpu=90.0, classes={"1": MIXED}))
    assert not [f for f in resting if "mix" in f.evidence["anomalies"]]  # (an overrun, maybe: not a mix)
    assert anomalies(snap(flat(), cpu=90.0, classes={"1": {**MIXED, "kind": "service"}})) == []
