"""Once per decision id: retries, re-runs and a crash between the audit row and the effect."""

from __future__ import annotations

import tempfile
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_cost.act import dispatch
from gpu_cost.act.base import ActionContext
from gpu_cost.audit.store import AuditStore
from gpu_cost.core.model import decision_id
from tests.fixtures.core import NOW
from tests.unit.policy.helpers import (
    Effects,
    H,
    install,
    job_finding,
    policy_from,
    process_finding,
    sweep_once,
)

POLICY = policy_from("mode: enforce\nrules: {idle_allocation: {ladder: [{action: cancel}]}}\n"
                     "approval: {gpu_hours_at_risk: 1000}")


@pytest.fixture
def effects(monkeypatch):  # type: ignore[no-untyped-def]
    e = Effects()
    install(monkeypatch, e)
    return e


def test_decision_id_is_deterministic_and_separates_its_inputs() -> None:
    base = decision_id("idle_allocation", "job:1", 1, 0, "live")
    assert base == decision_id("idle_allocation", "job:1", 1, 0, "live")
    others = {decision_id("zombie", "job:1", 1, 0, "live"), decision_id("idle_allocation", "job:2", 1, 0, "live"),
              decision_id("idle_allocation", "job:1", 2, 0, "live"), decision_id("idle_allocation", "job:1", 1, 1, "live"),
              decision_id("idle_allocation", "job:1", 1, 0, "dry-run")}
    assert base not in others and len(others) == 5


def test_a_retried_act_task_does_not_act_twice(store, effects) -> None:  # type: ignore[no-untyped-def]
    p = sweep_once(store, POLICY, [job_finding("1", now=NOW)], NOW)
    (d,) = p.decisions
    ctx = ActionContext(policy=POLICY, dry_run=False, now=NOW, run_id="r", sleep=lambda s: None)
    again = dispatch.execute([d], ctx, store)  # the task retried after it had finished
    assert again[0]["status"] == "succeeded" and again[0]["repeated"] is False
    assert effects.calls == [("cancel", "job:1")]
    rows = store.actions_of_decision(d.decision_id)
    assert len(rows) == 1 and rows[0]["status"] == "succeeded" and rows[0]["attempt"] == 1


def test_crash_between_started_row_and_effect_is_finished_once(store, effects) -> None:  # type: ignore[no-untyped-def]
    p = sweep_once(store, POLICY, [job_finding("2", now=NOW)], NOW, act=False)
    (d,) = p.decisions
    # the worker wrote the "started" row and died before the effect
    assert store.action_started(action_id=dispatch.action_id(d), decision_id=d.decision_id, run_id="r", action=d.action,
                                target=d.target, executor="x", dry_run=False, started_at=NOW)
    ctx = ActionContext(policy=POLICY, dry_run=False, now=NOW, run_id="r", sleep=lambda s: None)
    first = dispatch.execute([d], ctx, store)
    assert first[0]["resumed"] is True and first[0]["status"] == "succeeded"
    second = dispatch.execute([d], ctx, store)
    assert second[0]["status"] == "succeeded" and "resumed" not in second[0]
    assert effects.calls == [("cancel", "job:2")]
    row = store.actions_of_decision(d.decision_id)[0]
    assert row["attempt"] == 2 and row["status"] == "succeeded"
    assert store.get_decision(d.decision_id)["status"] == "acted"


def test_a_rerun_of_the_same_sweep_records_and_acts_nothing_new(store, effects) -> None:  # type: ignore[no-untyped-def]
    findings = [job_finding("3", now=NOW), process_finding(now=NOW)]
    sweep_once(store, policy_from("mode: enforce"), findings, NOW)
    n_decisions = len(store.query("SELECT * FROM gpu_cost_decisions"))
    again = sweep_once(store, policy_from("mode: enforce"), findings, NOW)
    assert again.decisions == []
    assert len(store.query("SELECT * FROM gpu_cost_decisions")) == n_decisions
    assert len(effects.calls) == 2


def test_audit_store_down_means_nothing_is_done(store, effects) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.core.errors import AuditError
    from tests.fixtures.core import free_port

    p = sweep_once(store, POLICY, [job_finding("4", now=NOW)], NOW, act=False)
    # a PostgreSQL audit store on a port nobody listens on: unreachable
    broken = AuditStore(f"postgresql://gpu_cost:x@127.0.0.1:{free_port()}/audit")
    ctx = ActionContext(policy=POLICY, dry_run=False, now=NOW, run_id="r", sleep=lambda s: None)
    with pytest.raises(AuditError, match="unavailable"):
        dispatch.execute(p.decisions, ctx, broken)
    assert effects.calls == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 8), st.booleans()), max_size=8,
                unique_by=lambda t: t[0]),
       st.sampled_from([0.0, 600.0, 4 * H]))
def test_running_the_engine_twice_on_the_same_state_yields_no_new_actions(monkeypatch, items, offset) -> None:  # type: ignore[no-untyped-def]
    effects = Effects()
    install(monkeypatch, effects)
    now = NOW + offset
    findings = [process_finding(1000 + i, gpus=g, now=now) if proc else job_finding(str(i), gpus=g, now=now)
                for i, g, proc in items]
    policy = policy_from("mode: enforce\ncaps: {max_actions_per_run: 100, max_gpu_share: 1}")
    with tempfile.TemporaryDirectory() as tmp:
        store = AuditStore(f"sqlite:///{tmp}/{uuid.uuid4().hex}.db").ensure_schema()
        sweep_once(store, policy, findings, now)
        done = list(effects.calls)
        assert len(done) == len(findings)
        sweep_once(store, policy, findings, now)
        assert effects.calls == done


@pytest.mark.parametrize(("env", "expected"), [(None, "None"), ("local", "LocalRunner()"),
                                               ("ssh", "SSHRunner('gpu_cost_slurm_ssh', host=None)")])
def test_the_act_task_picks_the_slurm_runner_from_the_environment(monkeypatch, env, expected) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.airflow.sweep_tasks import action_context, slurm_runner

    if env is None:
        monkeypatch.delenv("GPU_COST_SLURM", raising=False)
    else:
        monkeypatch.setenv("GPU_COST_SLURM", env)
    assert repr(slurm_runner()) == expected
    ctx = action_context(POLICY, NOW, "r")
    assert ctx.dry_run is False and repr(ctx.node_runner("gpu07")) == "SSHRunner('gpu_cost_node_ssh', host='gpu07')"


def test_an_unknown_slurm_runner_is_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.airflow.sweep_tasks import slurm_runner
    from gpu_cost.core.errors import GpuCostError

    monkeypatch.setenv("GPU_COST_SLURM", "telnet")
    with pytest.raises(GpuCostError, match="GPU_COST_SLURM='telnet': use local or ssh"):
        slurm_runner()
