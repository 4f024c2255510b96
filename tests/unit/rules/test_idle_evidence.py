"""Idle findings weighed with evidence: the job's log, power, CPU, class baselines, interactive
sessions; the confidence that gates destructive rungs; and how notices and the audit trail show it."""

from __future__ import annotations

import dataclasses
import html
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_cost.act.notices import render as notify
from gpu_cost.analyse.rules import run_rules
from gpu_cost.audit.trail import evidence_lines
from gpu_cost.config.schema import Policy
from gpu_cost.core import registry
from gpu_cost.core.model import Finding, Job, Node, Snapshot
from gpu_cost.decide.engine import decide
from gpu_cost.perceive.snapshot import from_matrix
from tests.fixtures.core import NOW
from tests.unit.policy.helpers import policy_from

H = 3600.0
STEP = 60.0
LOOKBACK = Policy().sweep.lookback  # 6 h
TIMES = np.arange(NOW - LOOKBACK + STEP, NOW + 1, STEP)
RESIDENT = 20000.0
ENFORCE = policy_from("mode: enforce\n")


def job(**kw: Any) -> Job:
    base: dict[str, Any] = {"job_id": "1", "user": "u", "account": "a", "partition": "batch", "name": "train-7",
                            "start_ts": NOW - 8 * H, "gpu_alloc": (("g1", (0,)),), "nodes": ("g1",), "batch": True}
    base.update(kw)
    return Job(**base)


def idle_for(seconds: float) -> np.ndarray:
    """Busy (85 %) until ``seconds`` ago, idle (0.2 %) since."""
    return np.where(TIMES <= NOW - seconds, 85.0, 0.2)


def snap(*, util: np.ndarray | float | None = None, mem: float = RESIDENT, power: float = 60.0,
         jobs: tuple[Job, ...] | None = None, gpus: int = 1, logs: dict[str, Any] | None = None,
         classes: dict[str, Any] | None = None, cpu: float | None = None, policy: Policy | None = None) -> Snapshot:
    """One node's GPUs from GPU × time matrices (the rule tests' way: from_matrix); idle for 3 h by default."""
    policy = policy or Policy()
    shape = (gpus, len(TIMES))
    u = np.broadcast_to(np.asarray(idle_for(3 * H) if util is None else util, dtype=float), shape).copy()
    s = from_matrix(
        policy=policy, now=NOW, source="test", hosts=np.array(["g1"] * gpus, dtype=object), gpus=np.arange(gpus),
        uuids=np.array([f"GPU-{i}" for i in range(gpus)], dtype=object),
        models=np.array(["a100"] * gpus, dtype=object), mem_total=np.full(gpus, 81920.0), times=TIMES, util=u,
        mem=np.full(shape, mem), power=np.full(shape, power), job=np.full(shape, "", dtype=object),
        jobs=jobs or (job(),), processes=(),
        nodes=(Node("g1", state="mixed", gpus_total=gpus, gpus_alloc=gpus, cpu_util=cpu),),
    )
    s.job_logs = dict(logs or {})
    s.classes = dict(classes or {})
    return s


CRASH = "step 900\nTraceback (most recent call last):\n  File \"train.py\", line 9\nRuntimeError: CUDA out of memory\n"


def log(text: str, ago: float) -> dict[str, Any]:
    return {"text": text, "size": len(text), "mtime": NOW - ago, "path": "/home/u/slurm-1.out"}


def idle(s: Snapshot, policy: Policy | None = None, rule: str = "idle_allocation") -> list[Finding]:
    return [f for f in run_rules(s, policy or Policy()) if f.rule == rule]


def rules_of(s: Snapshot, policy: Policy | None = None) -> set[str]:
    return {f.rule for f in run_rules(s, policy or Policy()) if f.rule in ("idle_allocation", "idle_interactive")}


def signal(f: Finding, what: str) -> dict[str, Any]:
    found = [x for x in f.evidence["signals"] if x["what"].lower() == what.lower()]
    assert found, (what, f.evidence["signals"])
    return found[0]


# -- the log ---------------------------------------------------------------------------------------


def test_an_idle_job_without_evidence_is_found() -> None:
    fs = idle(snap())
    assert [(f.target, f.action, f.inference) for f in fs] == [("job:1", "cancel", False)]
    ev = fs[0].evidence
    assert 0 <= ev["confidence"] <= 1 and ev["confidence_why"]
    assert all(set(x) == {"what", "value", "counted"} for x in ev["signals"])
    assert signal(fs[0], "GPU utilisation")["counted"] == "every allocated GPU under 5 %"
    assert "memory resident" in signal(fs[0], "GPU memory")["counted"]


def test_a_log_written_within_the_window_is_progress() -> None:
    assert idle(snap(logs={"1": log("loading shard 7/40\n", ago=120)})) == []


def test_a_stale_log_does_not_save_the_job() -> None:
    fs = idle(snap(logs={"1": log("loading shard 7/40\n", ago=2 * H)}))
    assert len(fs) == 1
    ev = fs[0].evidence
    sig = signal(fs[0], "job log")
    assert sig["value"] == "last written 7200 s ago" and sig["counted"] == "quiet: no progress lines"
    assert "log_state" not in ev
    # the GPUs hold memory: a model waiting for requests writes nothing either, so a quiet log says nothing more
    assert ev["confidence"] == idle(snap())[0].evidence["confidence"] < ENFORCE.evidence.min_confidence


def test_a_finished_log_is_named_and_raises_the_confidence() -> None:
    text = "epoch 30 val_acc=0.93\nTraining finished in 7h58m\nsaving logs\n"
    fs = idle(snap(logs={"1": log(text, ago=2 * H)}))
    assert len(fs) == 1
    ev = fs[0].evidence
    assert ev["log_state"] == "finished" and ev["log_line"] == "Training finished in 7h58m"
    sig = signal(fs[0], "job log")
    assert sig["value"] == "Training finished in 7h58m" and sig["counted"] == "it says the job finished"
    assert ev["confidence"] >= ENFORCE.evidence.min_confidence  # the log decides, despite the resident memory
    assert ev["confidence"] > idle(snap())[0].evidence["confidence"]
    assert registry.why(fs[0]).endswith("its log says it finished")


def test_a_finished_log_written_a_moment_ago_is_no_progress() -> None:
    fs = idle(snap(logs={"1": log("Training finished\n", ago=30)}))
    assert len(fs) == 1 and fs[0].evidence["log_state"] == "finished"


def test_a_crashed_log_is_named() -> None:
    fs = idle(snap(logs={"1": log(CRASH, ago=2 * H)}))
    assert len(fs) == 1 and fs[0].evidence["log_state"] == "crashed"
    assert fs[0].evidence["log_line"] == "RuntimeError: CUDA out of memory"


def test_an_unreadable_log_is_said_and_not_believed() -> None:
    fs = idle(snap(logs={"1": {"error": "job-log: permission denied"}}))
    assert len(fs) == 1
    sig = signal(fs[0], "job log")
    assert (sig["value"], sig["counted"]) == ("not read", "job-log: permission denied")
    assert fs[0].evidence["confidence"] == idle(snap())[0].evidence["confidence"]


def test_a_crash_followed_by_progress_lines_in_a_growing_log_is_progress() -> None:
    # its own script restarted it from a checkpoint; loading the data again
    text = CRASH + "restarting from checkpoint 9\nloading shard 1/40\nloading shard 2/40\n"
    assert idle(snap(logs={"1": log(text, ago=60)})) == []


def test_a_crash_followed_by_progress_lines_in_a_stale_log_is_no_verdict() -> None:
    text = CRASH + "restarting from checkpoint 9\nloading shard 1/40\n"
    fs = idle(snap(logs={"1": log(text, ago=2 * H)}))
    assert len(fs) == 1 and "log_state" not in fs[0].evidence
    assert signal(fs[0], "job log")["counted"] == "quiet: no progress lines"


def test_a_crash_is_no_progress_even_while_its_log_grows() -> None:
    fs = idle(snap(logs={"1": log(CRASH, ago=60)}))  # the traceback was just written
    assert len(fs) == 1 and fs[0].evidence["log_state"] == "crashed"


# -- power and CPU ---------------------------------------------------------------------------------


def test_gpu_power_above_the_threshold_is_progress() -> None:
    assert idle(snap(power=200.0)) == []
    assert len(idle(snap(power=100.0))) == 1  # under the 150 W of power_active_w


@pytest.mark.parametrize("case", ["session", "hour-window"])
def test_gpu_power_is_progress_whatever_window_the_rule_judges_over(case: str) -> None:
    """A rule with a window of its own (the idle-interactive rule's two hours; an idle-allocation window tuned to an
    hour, as ``gpu-cost tune`` tries) reads the GPUs' power as the snapshot measures it, over its primary window:
    the power a window of its own carried was none at all (NaN), so drawing 200 W no longer spared the job there."""
    if case == "session":
        jobs, policy, rule = (job(batch=False),), Policy(), "idle_interactive"
    else:
        jobs, policy, rule = None, policy_from("rules: {idle_allocation: {window: 1h}}\n"), "idle_allocation"
    assert len(idle(snap(jobs=jobs, power=100.0, policy=policy), policy, rule)) == 1  # under power_active_w
    s = snap(jobs=jobs, power=200.0, policy=policy)
    window = 2 * H if case == "session" else H
    assert s.columns(window).get("power_w", float).tolist() == [200.0]
    assert idle(s, policy, rule) == []


def test_the_power_threshold_comes_from_the_policy() -> None:
    p = policy_from("evidence: {power_active_w: 250}\n")
    assert len(idle(snap(power=200.0), p)) == 1
    p = policy_from("evidence: {power_active_w: 50}\n")
    assert idle(snap(power=60.0), p) == []


def test_a_busy_cpu_on_a_node_the_job_has_alone_is_progress() -> None:
    assert idle(snap(cpu=90.0)) == []
    assert len(idle(snap(cpu=20.0))) == 1
    # another job on the node: its CPU could be the other job's
    other = job(job_id="2", name="other-run", gpu_alloc=(("g1", (1,)),))
    fs = idle(snap(cpu=90.0, gpus=2, util=np.vstack([idle_for(3 * H), np.full(len(TIMES), 90.0)]),
                   jobs=(job(), other)))
    assert [f.job_id for f in fs] == ["1"]



def test_busy_network_and_disk_on_a_node_the_job_has_alone_is_progress() -> None:
    """Reading a data set from storage keeps the GPUs idle and the node's network busy: not waste."""
    def with_io(s: Snapshot, mib_s: float) -> Snapshot:
        s.nodes = tuple(dataclasses.replace(n, io_bps=mib_s * 1048576) for n in s.nodes)
        return s

    assert idle(with_io(snap(), 200.0)) == []
    assert len(idle(with_io(snap(), 5.0))) == 1
    other = job(job_id="2", name="other-run", gpu_alloc=(("g1", (1,)),))
    shared = with_io(snap(gpus=2, util=np.vstack([idle_for(3 * H), np.full(len(TIMES), 90.0)]), jobs=(job(), other)),
                     200.0)
    assert [f.job_id for f in idle(shared)] == ["1"]  # the other job's traffic tells nothing about this one
    p = policy_from("evidence: {io_busy_mib_s: 500}\n")
    assert len(idle(with_io(snap(policy=p), 200.0), p)) == 1


def test_the_live_nodes_carry_network_and_disk_rates() -> None:
    from gpu_cost.perceive import prometheus as prom
    from gpu_cost.perceive.live import _merge_nodes

    q = prom.nodes_query('job="node"', 900)
    assert "node_disk_read_bytes_total" in q and "node_disk_written_bytes_total" in q
    stats = {"g1": {"cpu_util": 10.0, "net_rx_bps": 3.0e6, "net_tx_bps": 1.0e6, "disk_read_bps": 2.0e6,
                    "disk_write_bps": float("nan")}}
    merged = _merge_nodes([Node("g1"), Node("g2")], pd.DataFrame(), stats)
    assert merged[0].io_bps == 6.0e6 and merged[1].io_bps is None


# -- class baselines -------------------------------------------------------------------------------


SERVICE = {"key": "user=u|account=a|partition=batch|name=train-#|gpus=1", "members": 5, "kind": "service",
           "busy_share": 0.1, "waking_share": 0.8, "mem_resident_share": 1.0}


def test_a_job_whose_class_is_a_service_is_only_advised() -> None:
    fs = idle(snap(classes={"1": SERVICE}))
    assert [(f.action, f.inference) for f in fs] == [("advise", True)]
    ev = fs[0].evidence
    assert "service" in ev["inference"] and ev["class"]["kind"] == "service" and ev["class"]["members"] == 5
    assert signal(fs[0], "class baseline")["counted"] == "behaves like a service: advice only"
    assert ev["confidence"] < idle(snap())[0].evidence["confidence"]


def test_a_member_that_is_a_service_itself_is_only_advised() -> None:
    klass = {"key": "k", "members": 1, "kind": "unknown", "member_kind": "service", "member_wakes": 4}
    fs = idle(snap(classes={"1": klass}))
    assert [(f.action, f.inference) for f in fs] == [("advise", True)]


def test_a_training_class_changes_nothing() -> None:
    fs = idle(snap(classes={"1": dict(SERVICE, kind="training", busy_share=0.9)}))
    assert [(f.action, f.inference) for f in fs] == [("cancel", False)]
    assert signal(fs[0], "class baseline")["counted"] == "no service pattern"


def test_a_class_of_another_job_changes_nothing() -> None:
    fs = idle(snap(classes={"2": SERVICE}))
    assert [(f.action, f.inference) for f in fs] == [("cancel", False)]
    assert "class" not in fs[0].evidence


# -- interactive sessions --------------------------------------------------------------------------


SESSIONS = [pytest.param({"batch": False}, id="no-batch-script"),
            pytest.param({"batch": None, "partition": "interactive"}, id="interactive-partition"),
            pytest.param({"batch": None, "name": "jupyter-lab"}, id="notebook-name")]


@pytest.mark.parametrize("kw", SESSIONS)
def test_a_session_idle_for_half_an_hour_is_left_alone(kw: dict[str, Any]) -> None:
    assert rules_of(snap(util=idle_for(30 * 60), jobs=(job(**kw),))) == set()


def test_a_batch_job_idle_for_half_an_hour_is_found() -> None:
    assert rules_of(snap(util=idle_for(30 * 60))) == {"idle_allocation"}


@pytest.mark.parametrize("kw", SESSIONS)
def test_a_session_idle_for_hours_is_idle_interactive_only(kw: dict[str, Any]) -> None:
    s = snap(util=idle_for(3 * H), jobs=(job(**kw),))
    assert rules_of(s) == {"idle_interactive"}
    f = idle(s, rule="idle_interactive")[0]
    assert f.target == "job:1" and f.evidence["window_s"] == 2 * H and f.evidence["interactive"]
    assert signal(f, "interactive session")["value"] == f.evidence["interactive"]


def test_a_session_just_under_the_interactive_window_is_left_alone() -> None:
    assert rules_of(snap(util=idle_for(2 * H - 10 * 60), jobs=(job(batch=False),))) == set()


def test_sessions_recognised_by_the_policy() -> None:
    p = policy_from("interactive: {batch_flag: false, partitions: [], name_patterns: [], labels: []}\n")
    # with nothing recognising sessions, an salloc job is a batch job like any other
    assert rules_of(snap(util=idle_for(30 * 60), jobs=(job(batch=False),)), p) == {"idle_allocation"}


def test_a_session_showing_progress_is_left_alone() -> None:
    s = snap(util=idle_for(3 * H), jobs=(job(batch=False),), logs={"1": log("In [42]: df.head()\n", ago=600)})
    assert rules_of(s) == set()  # written 10 minutes ago: within the 2 h window


# -- the engine ------------------------------------------------------------------------------------


def at_demote(f: Finding) -> dict:
    """Escalation state with notify and notify_manager done: the next rung is demote (destructive)."""
    return {(f.rule, f.target, "live"): {"state": "open", "episode": 1, "rung": 1, "first_seen": NOW - 3 * H,
                                         "last_action_at": NOW - 2 * H}}


def decision(f: Finding, policy: Policy = ENFORCE, escalations: dict | None = None):  # type: ignore[no-untyped-def]
    plan = decide([f], policy, now=NOW, escalations=at_demote(f) if escalations is None else escalations,
                  total_gpus=64)
    assert len(plan.decisions) == 1, plan.waiting
    return plan.decisions[0]


def low_confidence_finding() -> Finding:
    # memory resident, nothing in the log, a class that says training: low confidence, but classified
    f = idle(snap(classes={"1": dict(SERVICE, kind="training", busy_share=0.9)}))[0]
    assert f.evidence["confidence"] < ENFORCE.evidence.min_confidence
    return f


def test_a_job_the_agent_cannot_classify_gets_notices_only() -> None:
    f = idle(snap())[0]  # memory resident, nothing else known: no class, confidence under min_confidence
    assert f.evidence["confidence"] < ENFORCE.evidence.min_confidence and f.evidence["mem_resident"] is True
    plan = decide([f], ENFORCE, now=NOW, escalations=at_demote(f), total_gpus=64)
    assert plan.decisions == [] and plan.waiting[0]["why"] == "ladder complete"
    d = decision(f, escalations={})
    assert d.action == "notify" and "the agent cannot classify it (kind unknown)" in d.evidence["unsure"]


def test_low_confidence_makes_a_destructive_rung_wait_for_a_human() -> None:
    f = low_confidence_finding()
    d = decision(f)
    assert d.action == "demote" and d.requires_approval
    assert f"confidence {f.evidence['confidence']:.2f} is below evidence.min_confidence 0.5" in d.reason
    assert d.evidence["confidence"] == f.evidence["confidence"]


def test_enough_confidence_acts_without_approval() -> None:
    f = idle(snap(mem=0.0))[0]  # empty GPUs: nothing to serve
    assert f.evidence["confidence"] >= ENFORCE.evidence.min_confidence
    d = decision(f)
    assert d.action == "demote" and not d.requires_approval and "min_confidence" not in d.reason


def test_a_finished_log_lets_a_destructive_rung_act() -> None:
    f = idle(snap(logs={"1": log("Training finished\n", ago=2 * H)}))[0]
    d = decision(f)
    assert d.action == "demote" and not d.requires_approval


def test_min_confidence_comes_from_the_policy() -> None:
    f = low_confidence_finding()
    conf = f.evidence["confidence"]
    assert not decision(f, policy_from(f"mode: enforce\nevidence: {{min_confidence: {conf}}}\n")).requires_approval
    assert decision(f, policy_from(f"mode: enforce\nevidence: {{min_confidence: {conf + 0.01:.2f}}}\n")).requires_approval


def test_low_confidence_never_holds_a_notice() -> None:
    f = low_confidence_finding()
    d = decision(f, escalations={})
    assert d.action == "notify" and not d.requires_approval


# -- notices and the audit trail -------------------------------------------------------------------


def test_the_notice_shows_chart_signals_and_confidence() -> None:
    f = idle(snap(logs={"1": log("epoch 3\nTraining finished\n", ago=2 * H)}))[0]
    d = decision(f, escalations={})
    ev = d.evidence
    assert len(ev["chart"]) == 12 and ev["chart"].startswith("▇") and ev["chart"].endswith("▁")
    msg = notify.render(d, ENFORCE, NOW)
    pct = f"Confidence that this is waste: {round(ev['confidence'] * 100)} %"
    for text in (msg.text, html.unescape(msg.html)):
        assert "Utilisation over the last 6h: " in text and ev["chart"] in text
        assert len(ev["signals"]) == 3  # utilisation, memory, the log
        for sig in ev["signals"]:
            assert f"{sig['what']}: {sig['value']} — {sig['counted']}" in text, (sig, text)
        assert pct in text
    assert "Training finished" in msg.text


def test_the_notice_keeps_the_signal_names_as_written() -> None:
    d = decision(idle(snap())[0], escalations={})
    msg = notify.render(d, ENFORCE, NOW)
    for text in (msg.text, html.unescape(msg.html)):
        assert "GPU utilisation: max" in text and "GPU memory: " in text and "Gpu " not in text


def test_a_notice_without_evidence_shows_none_of_it() -> None:
    d = decision(idle(snap())[0], escalations={})
    bare = dataclasses.replace(d, evidence={k: v for k, v in d.evidence.items()
                                            if k not in ("chart", "chart_span_s", "signals", "confidence")})
    msg = notify.render(bare, ENFORCE, NOW)
    assert "Confidence that this is waste" not in msg.text and "Utilisation over the last 6h" not in msg.text
    assert "Confidence that this is waste" not in msg.html


def test_the_audit_trail_shows_chart_signals_and_confidence() -> None:
    f = low_confidence_finding()
    d = decision(f)
    lines = evidence_lines(d.evidence)
    assert f"utilisation over the lookback: {d.evidence['chart']}" in lines
    for sig in d.evidence["signals"]:
        assert f"evidence: {sig['what']}: {sig['value']} — {sig['counted']}" in lines
    conf = [x for x in lines if x.startswith("confidence: ")]
    assert len(conf) == 1 and conf[0].startswith(f"confidence: {d.evidence['confidence']:.2f} (")
    assert "memory resident" in conf[0]


def test_the_audit_trail_of_old_evidence_falls_back_to_its_fields() -> None:
    assert evidence_lines({"util_max": 0.3, "window_s": 900, "gpu_ids": ["g1:0"]}) == [
        "evidence: util_max=0.3, window_s=900"]
