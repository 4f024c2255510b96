"""``gpu_manual_reclaim`` through Airflow (``dag.test()``) on the simulator, with Slack on loopback."""

from __future__ import annotations

import json
import threading

import pendulum
import pytest

from gpu_cost.audit.store import AuditStore
from tests.fixtures.airflow_db import fresh_dag
from tests.fixtures.airflow_db import respond_when_waiting as _respond

pytestmark = pytest.mark.e2e

DAG_ID = "gpu_manual_reclaim"

#: the runs' data instant, fixed: at the default scenario's anchor (the start of a UTC day) the
#: simulated cluster is exactly the shipped picture, whatever the wall clock says
WHEN = pendulum.datetime(2026, 11, 30, tz="UTC")


#: the deployment's policy for these runs: the shipped one, enforcing, with the runs' requester
#: (``dag.test()`` triggers as ``dag_test``) an operator and ``approver`` the override approver
OPS_POLICY = "ops"


@pytest.fixture
def dag(airflow_db, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from tests.fixtures.core import ROOT

    shipped = (ROOT / "include" / "policy" / "default.yaml").read_text()
    ops = (shipped.replace("mode: dry-run", "mode: enforce", 1).replace("  operators: []", "  operators: [dag_test]", 1)
           .replace("  override_approvers: []", "  override_approvers: [approver, dag_test]", 1))
    assert ops.count("dag_test") == 2
    (tmp_path / f"{OPS_POLICY}.yaml").write_text(ops)
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))
    return fresh_dag(DAG_ID)


@pytest.fixture
def slack(slack_sink, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url()}))
    return slack_sink


def _run(dag, conf):  # type: ignore[no-untyped-def]
    dr = dag.test(run_conf={"policy": OPS_POLICY, **conf}, logical_date=WHEN)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    return dr, states


def _decisions(dr) -> list[dict]:  # type: ignore[no-untyped-def, type-arg]
    return AuditStore().decisions_of_run(f"{DAG_ID}:{dr.run_id}")


def _actions(rows) -> list[dict]:  # type: ignore[no-untyped-def, type-arg]
    store = AuditStore()
    return [a for r in rows for a in store.actions_of_decision(r["decision_id"])]


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        ({"target_ids": ["1003"], "reason": "short"}, "reason"),
        ({"target_ids": ["1003; rm -rf /"], "reason": "cleanup of idle jobs"}, "target_ids"),
        ({"target_ids": [], "reason": "cleanup of idle jobs"}, "target_ids"),
        ({"target_ids": ["1003"], "reason": "cleanup of idle jobs", "action": "shutdown"}, "action"),
        ({"target_ids": ["1003"], "reason": "cleanup of idle jobs", "dry_run": "no"}, "dry_run"),
        ({"target_ids": ["1003"]}, "reason"),
    ],
    ids=["short-reason", "shell-chars", "no-ids", "unknown-action", "dry-run-not-bool", "reason-missing"],
)
def test_bad_form_is_refused_before_a_run_starts(dag, conf, match) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=match):
        dag.test(run_conf=conf)


def test_kind_specific_ids_are_refused_by_prepare_and_nothing_acts(dag, slack) -> None:  # type: ignore[no-untyped-def]
    dr, states = _run(dag, {"target_kind": "job", "target_ids": ["gpu01"], "action": "cancel",
                            "reason": "cleanup of idle jobs", "dry_run": False})
    assert dr.state == "failed" and states["prepare"] == "failed" and states["act"] == "upstream_failed"
    run = AuditStore().get_run(f"{DAG_ID}:{dr.run_id}")
    assert run["status"] == "refused" and "'gpu01' is not a Slurm job id" in run["problems"]
    assert run["mode"] == "enforce"  # its policy's mode; "refused" is the run's status, never a mode
    assert _decisions(dr) == [] and slack.requests == []


def test_dry_run_is_the_default_and_acts_on_nothing(dag, slack) -> None:  # type: ignore[no-untyped-def]
    dr, states = _run(dag, {"target_ids": ["1003"], "reason": "idle for hours, freeing GPUs"})
    assert dr.state == "success", states
    assert states["approve"] == "skipped" and states["act"] == "success" and states["act_approved"] == "skipped"
    (row,) = _decisions(dr)
    assert row["rule"] == "manual" and row["mode"] == "dry-run" and row["action"] == "notify"
    assert row["job_id"] == "1003" and row["user_name"] == "carol"
    # recorded as the sweep records a dry-run decision: no action row, no approval, nothing sent
    assert row["status"] == "recorded" and not row["requires_approval"]
    assert _actions([row]) == []
    assert slack.requests == []
    assert AuditStore().get_run(f"{DAG_ID}:{dr.run_id}")["status"] == "ok"


def test_notify_for_real_goes_through_the_same_executor_and_audit(dag, slack) -> None:  # type: ignore[no-untyped-def]
    dr, states = _run(dag, {"target_kind": "user", "target_ids": ["carol"], "action": "notify",
                            "reason": "please release idle GPUs", "dry_run": False})
    assert dr.state == "success", states
    (row,) = _decisions(dr)
    assert row["target"] == "user:carol" and row["mode"] == "enforce"
    (action,) = _actions([row])
    assert action["status"] == "succeeded" and action["dry_run"] == 0
    (req,) = slack.requests
    assert "please release idle GPUs" in req.body["text"] and "requested by an operator" in req.body["text"]


def test_protection_is_honoured_without_override(dag, slack) -> None:  # type: ignore[no-untyped-def]
    # job 1007 carries the no-interrupt label: protected at level "never"
    dr, states = _run(dag, {"target_ids": ["1007", "1003"], "action": "demote", "reason": "testing protections"})
    assert dr.state == "success", states
    rows = {r["job_id"]: r for r in _decisions(dr)}
    assert rows["1007"]["action"] == "none" and rows["1007"]["protection"] == "no-interrupt label"
    assert "protected by 'no-interrupt label'" in rows["1007"]["reason"]
    assert rows["1003"]["action"] == "demote" and rows["1003"]["mode"] == "dry-run"
    assert rows["1003"]["status"] == rows["1007"]["status"] == "recorded"
    assert _actions(list(rows.values())) == []  # a dry run acts on nothing, protected or not


def respond_when_waiting(dag_id: str, task_id: str, chosen: list[str], timeout: float = 240) -> bool:
    """Answer the HITL request as 'approver' (see ``tests.fixtures.airflow_db.respond_when_waiting``)."""
    return _respond(dag_id, task_id, chosen, timeout=timeout, by='approver')


@pytest.mark.timeout(300)
@pytest.mark.parametrize("answer", ["Approve", "Reject"])
def test_override_is_recorded_and_needs_a_second_person(dag, slack, answer) -> None:  # type: ignore[no-untyped-def]
    t = threading.Thread(target=respond_when_waiting, args=(DAG_ID, "approve", [answer]), daemon=True)
    t.start()
    dr, states = _run(dag, {"target_ids": ["1007"], "action": "notify", "reason": "owner unreachable for days",
                            "dry_run": False, "override_protections": True,
                            "override_justification": "approved by the research lead in ticket 42"})
    t.join(5)
    assert dr.state == "success", states
    (row,) = _decisions(dr)
    ev = json.loads(row["evidence"])
    assert ev["override"]["protection"] == "no-interrupt label"
    assert ev["override"]["justification"] == "approved by the research lead in ticket 42"
    assert "OVERRIDDEN" in row["reason"] and row["requires_approval"] == 1
    # the approval request itself is announced on Slack (the notifier never fails the task)
    texts = slack.texts()
    assert texts and texts[0].startswith("Approval needed: ")
    if answer == "Approve":
        assert row["approval_status"] == "approved" and row["approved_by"] == "approver"
        assert states["act_approved"] == "success" and len(texts) == 2
        assert "owner unreachable for days" in texts[1]
    else:
        assert row["approval_status"] == "rejected" and row["status"] == "rejected"
        assert states["act_approved"] == "skipped" and len(texts) == 1 and _actions([row]) == []
        assert AuditStore().get_run(f"{DAG_ID}:{dr.run_id}")["status"] == "rejected"
    assert states["act"] == "success"  # the automatic branch ran, with nothing of its own to do


def test_override_without_justification_is_refused(dag) -> None:  # type: ignore[no-untyped-def]
    dr, states = _run(dag, {"target_ids": ["1007"], "action": "notify", "reason": "owner unreachable for days",
                            "override_protections": True})
    assert states["prepare"] == "failed"
    assert "override_justification" in AuditStore().get_run(f"{DAG_ID}:{dr.run_id}")["problems"]


@pytest.mark.timeout(300)
def test_reject_holds_back_only_what_the_request_listed(dag, slack) -> None:  # type: ignore[no-untyped-def]
    """One protected job overridden (needs a second person) next to an unprotected one: a Reject stops
    the overridden notice only; the unprotected job's notice went out without waiting for the answer."""
    t = threading.Thread(target=respond_when_waiting, args=(DAG_ID, "approve", ["Reject"]), daemon=True)
    t.start()
    dr, states = _run(dag, {"target_ids": ["1007", "1003"], "action": "notify", "reason": "owner unreachable for days",
                            "dry_run": False, "override_protections": True,
                            "override_justification": "approved by the research lead in ticket 42"})
    t.join(5)
    assert dr.state == "success", states
    assert states["act"] == "success" and states["approve"] == "success" and states["act_approved"] == "skipped"
    rows = {r["job_id"]: r for r in _decisions(dr)}
    assert rows["1007"]["requires_approval"] == 1 and rows["1007"]["approval_status"] == "rejected"
    assert rows["1003"]["requires_approval"] == 0
    assert _actions([rows["1007"]]) == []
    (done,) = _actions([rows["1003"]])
    assert done["status"] == "succeeded" and done["dry_run"] == 0
    # the request listed only the overridden job; Slack got it plus carol's notice, nothing for 1007's owner.
    # The automatic branch and the approval run side by side, so the two messages may come in either order.
    texts = slack.texts()
    requests = [t for t in texts if t.startswith("Approval needed: ")]
    notices = [t for t in texts if not t.startswith("Approval needed: ")]
    assert len(requests) == 1 and len(notices) == 1, texts
    assert "approve 1 action(s)" in requests[0]
    assert "owner unreachable for days" in notices[0] and "for carol" in notices[0]
    run = AuditStore().get_run(f"{DAG_ID}:{dr.run_id}")
    assert run["status"] == "rejected"
    assert json.loads(run["counts"])["acted"] == 1
