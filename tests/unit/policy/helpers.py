"""Shared helpers for the decision-engine tests: findings, policies, one simulated sweep."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from gpu_cost.act import dispatch
from gpu_cost.act.base import ActionContext, Outcome
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Decision, Finding, Snapshot, empty_gpu_frame
from gpu_cost.decide.engine import Plan
from gpu_cost.loop import sweep

H = 3600.0


def job_finding(job_id: str = "1", *, user: str = "alice", gpus: int = 1, ran_s: float = H, now: float = 0.0,
                rule: str = "idle_allocation", inference: bool = False, **kw: Any) -> Finding:
    """An idle-allocation finding for job ``job_id`` that has run ``ran_s`` at ``now``."""
    return Finding(rule=rule, target_kind="job", target=f"job:{job_id}", action="cancel", gpus=gpus, job_id=job_id,
                   user=user, account=kw.pop("account", "acct"), partition=kw.pop("partition", "batch"),
                   qos=kw.pop("qos", "normal"), name=kw.pop("name", "train"), host=kw.pop("host", "g1"),
                   gpu_ids=tuple(f"g1:{i}" for i in range(gpus)), job_start_ts=now - ran_s,
                   time_limit_s=kw.pop("time_limit_s", 48 * H), inference=inference,
                   evidence={"util_max": 0.3, "window_s": 900}, **kw)


def process_finding(pid: int = 4242, *, user: str = "bob", gpus: int = 1, now: float = 0.0) -> Finding:
    return Finding(rule="zombie", target_kind="process", target=f"proc:g1:{pid}:{int(now - H)}", action="kill_process",
                   gpus=gpus, user=user, host="g1", gpu_ids=tuple(f"g1:{i}" for i in range(gpus)),
                   evidence={"pid": pid, "process_start_ts": now - H, "window_s": 900, "mem_min_mib": 2000,
                             "util_max": 5})


def assert_policy_error(path: Any, text: str, pattern: str) -> None:
    """Write ``text`` to ``path``: loading it must raise PolicyError matching ``pattern``, starting with the file."""
    import pytest

    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.errors import PolicyError

    path.write_text(text)
    with pytest.raises(PolicyError, match=pattern) as exc:
        load_policy(path)
    assert str(exc.value).startswith(f"{path}: ")


def policy_from(text: str = "", **top: Any) -> Policy:
    p = parse_policy(text, "<test>")
    if top:
        src = p.source
        p = dataclasses.replace(p, **top)
        object.__setattr__(p, "source", src)
    return p


def snapshot(now: float, degraded: bool = False, gpus: int = 1024) -> Snapshot:
    """A snapshot of a cluster of ``gpus`` GPUs (0: of unknown size, where destructive actions are refused)."""
    frame = empty_gpu_frame()
    if gpus:
        frame = frame.reindex(range(gpus))
    return Snapshot(ts=now, window_s=900, lookback_s=6 * H, source="test", gpus=frame,
                    problems=("test: degraded",) if degraded else ())


class Effects:
    """A test executor (the real ones belong to other modules): counts each effect once per target+action."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.done: set[tuple[str, str]] = set()

    def __call__(self, d: Decision, ctx: ActionContext) -> Outcome:
        self.calls.append((d.action, d.target))
        if ctx.dry_run:
            return Outcome("skipped", command=f"would {d.action} {d.target}")
        # idempotent like the real executors: re-checks before acting
        self.done.add((d.action, d.target))
        return Outcome("succeeded", command=f"{d.action} {d.target}")


def install(monkeypatch: Any, effects: Callable[[Decision, ActionContext], Outcome]) -> None:
    dispatch.load_executors()
    for name in ("advise", "notify", "notify_manager", "demote", "hold", "requeue", "terminate", "kill", "cancel",
                 "kill_process"):
        monkeypatch.setitem(dispatch.REGISTRY, name, effects)


def sweep_once(store: AuditStore, policy: Policy, findings: Sequence[Finding], now: float, *,
               degraded: bool = False, act: bool = True, approve: bool = True) -> Plan:
    """Plan, record and (for acting decisions) dispatch, the way the sweep DAG does."""
    snap = snapshot(now, degraded)
    p = sweep.plan(list(findings), snap, policy, store, now, predicted_end={})
    run_id = f"test:{int(now)}"
    store.begin_run(run_id, dag_id="test", started_at=now, data_ts=now, source="test", mode=policy.mode)
    sweep.record(p, store, run_id, now)
    if act and not p.cap_violation:
        chosen = [d for d in p.decisions if d.acts and (approve or not d.requires_approval)]
        for d in chosen:
            if d.requires_approval:
                store.set_approval(d.decision_id, "approved", "tester", now)
        ctx = ActionContext(policy=policy, dry_run=False, now=now, run_id=run_id, sleep=lambda s: None)
        dispatch.execute(chosen, ctx, store)
    return p


def actions(p: Plan) -> list[tuple[str, str]]:
    return [(d.target, d.action) for d in p.decisions]
