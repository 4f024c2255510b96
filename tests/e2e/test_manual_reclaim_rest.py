"""A protection override is approved by a second person, never by its requester (real Airflow, REST only).

The session's deployment (api-server, scheduler, dag-processor; ``tests.fixtures.airflow_server``)
knows two SimpleAuthManager users, ``admin`` and ``lead``, and a policy directory holding
``ops.yaml``: the shipped policy, enforcing, with ``admin`` as an operator and ``admin`` and
``lead`` as override approvers. As ``admin``, a person
triggers ``gpu_manual_reclaim`` over REST to notify the owner of the simulator's job 1007, which
carries the ``no-interrupt`` protection, overriding it. The run must name ``admin`` as the requester,
ask for approval with only ``lead`` assigned, and not act on the requester's own *Approve*: Airflow
refuses it (403), or, if it lets it through, the operator records it as ``refused`` and nothing acts.
In the first case ``lead`` then approves, and the notice goes out once, recorded as approved by lead.
"""

from __future__ import annotations

import json
import time
import urllib.error
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gpu_cost.audit.store import AuditStore
from tests.fixtures.airflow_server import SESSION_WEBHOOK, AirflowServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

DAG_ID = "gpu_manual_reclaim"
WEBHOOK = SESSION_WEBHOOK
CONF = {
    "policy": "ops", "source": "sim", "target_kind": "job", "target_ids": ["1007"], "action": "notify",
    "reason": "owner unreachable for days", "dry_run": False, "override_protections": True,
    "override_justification": "approved by the research lead in ticket 42",
}
@pytest.fixture(scope="module")
def server(airflow_server: AirflowServer) -> AirflowServer:
    """The session's deployment (shared with the UI tests): its default policy is ``ops``, as below."""
    return airflow_server


def _hitl_path(run_id: str) -> str:
    return f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/approve/-1/hitlDetails"


def _answer(server: AirflowServer, run_id: str, user: str, option: str) -> tuple[int, str]:
    """PATCH the Required Action as ``user``; return (HTTP status, body)."""
    try:
        body = server.api(_hitl_path(run_id), "PATCH", {"chosen_options": [option], "params_input": {}}, user=user)
        return 200, json.dumps(body)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _request_when_asked(server: AirflowServer, run_id: str) -> dict[str, Any] | None:
    """Return the approve task's Required Action once written; fail at once if the run ended instead."""
    run = server.dag_run(DAG_ID, run_id)
    if run["state"] in ("success", "failed"):
        pytest.fail(f"the run ended ({run['state']}) without asking for approval\n{server.logs_tail(60)}")
    if server.task_state(DAG_ID, run_id, "approve") != "awaiting_input":
        return None
    return server.api(_hitl_path(run_id))  # type: ignore[no-any-return]


def _finished(server: AirflowServer, run_id: str) -> str | None:
    state = server.dag_run(DAG_ID, run_id)["state"]
    return str(state) if state in ("success", "failed") else None


def _notices(sink: Any) -> list[str]:
    """Texts the deployment posted to its Slack webhook (approval requests and owner notices)."""
    return [r.body.get("text", "") or json.dumps(r.body) for r in list(sink.requests) if r.path == WEBHOOK]


def test_override_is_approved_by_a_second_person_never_the_requester(server: AirflowServer,
                                                                      _slack_server: Any) -> None:
    store = AuditStore(server.audit_url)
    run = server.api(f"/api/v2/dags/{DAG_ID}/dagRuns", "POST", {"logical_date": None, "conf": CONF}, user="admin")
    run_id = str(run["dag_run_id"])
    audit_id = f"{DAG_ID}:{run_id}"
    assert run.get("triggering_user_name") == "admin", run

    request = server.wait_for(lambda: _request_when_asked(server, run_id), "the approve task's Required Action",
                              timeout=180)
    # the run pinned the named policy of the directory, not the deployment's default
    pinned = store.fetch("pinned_policy", {"run_id": audit_id})
    assert [p["name"] for p in pinned] == ["ops"], pinned
    assert pinned[0]["content"] == (Path(server.env["GPU_COST_POLICY_DIR"]) / "ops.yaml").read_text(encoding="utf-8")

    decisions = store.decisions_of_run(audit_id)
    assert len(decisions) == 1, decisions
    decision = decisions[0]
    evidence = json.loads(decision["evidence"])
    assert (decision["target"], decision["action"], decision["protection"]) == (
        "job:1007", "notify", "no-interrupt label"), decision
    assert decision["requires_approval"] and decision["approval_status"] == "pending", decision
    assert evidence["requested_by"] == "admin", evidence
    assert evidence["approvers"] == ["lead"], evidence  # the requester left out of the override approvers
    assert evidence["override"]["justification"] == CONF["override_justification"], evidence

    # the request is addressed to lead only
    assigned = {u["id"] for u in request.get("assigned_users") or []}
    assert "lead" in assigned and "admin" not in assigned, request
    assert request.get("response_received") is False and request.get("chosen_options") in (None, []), request
    assert decision["decision_id"] in (request.get("body") or ""), request  # the request lists the decision
    notices_before = _notices(_slack_server)

    # the requester approves their own override
    code, text = _answer(server, run_id, "admin", "Approve")
    if code == 200:
        # Airflow let it through: the operator must refuse it, and nothing acts
        assert server.wait_for(lambda: _finished(server, run_id), "the run to end after the refused answer",
                               timeout=180) == "success", server.logs_tail(60)
        assert server.task_state(DAG_ID, run_id, "act_approved") == "skipped"
        row = store.get_decision(decision["decision_id"])
        assert row is not None and row["approval_status"] == "refused" and row["approved_by"] == "admin", row
        assert row["status"] == "rejected", row
        assert store.query("SELECT * FROM gpu_cost_actions WHERE decision_id = :d",
                           {"d": decision["decision_id"]}) == []
        assert _notices(_slack_server) == notices_before  # no notice went to the owner
        assert _answer(server, run_id, "lead", "Approve")[0] == 409  # the request was answered (as a no)
        return

    assert code == 403, (code, text)  # Airflow itself refused: admin is not an assigned user
    assert "not a respondent" in text, text
    time.sleep(5)  # a wrongly accepted answer would have resumed the task by now (heartbeat 2 s)
    after = server.api(_hitl_path(run_id))
    assert after.get("response_received") is False and after.get("responded_by_user") is None, after
    assert server.task_state(DAG_ID, run_id, "approve") == "awaiting_input"
    assert server.task_state(DAG_ID, run_id, "act_approved") not in ("running", "success", "failed")
    assert server.dag_run(DAG_ID, run_id)["state"] == "running"
    row = store.get_decision(decision["decision_id"])
    assert row is not None and row["approval_status"] == "pending" and row["approved_by"] is None, row
    assert store.query("SELECT * FROM gpu_cost_actions WHERE decision_id = :d", {"d": decision["decision_id"]}) == []
    assert _notices(_slack_server) == notices_before

    # the second person approves: the notice goes out, recorded as lead's approval
    code, text = _answer(server, run_id, "lead", "Approve")
    assert code == 200, (code, text)

    state = server.wait_answering_again(DAG_ID, run_id, lambda: _answer(server, run_id, "lead", "Approve"),
                                        "the run to end after lead's answer")
    assert state == "success", server.logs_tail(60)
    assert server.task_state(DAG_ID, run_id, "approve") == "success", server.logs_tail(120)
    assert server.task_state(DAG_ID, run_id, "act_approved") == "success"
    row = store.get_decision(decision["decision_id"])
    assert row is not None and row["approval_status"] == "approved" and row["approved_by"] == "lead", row
    actions = store.query("SELECT * FROM gpu_cost_actions WHERE decision_id = :d", {"d": decision["decision_id"]})
    assert [a["status"] for a in actions] == ["succeeded"], actions
    sent = _notices(_slack_server)[len(notices_before):]
    assert len([t for t in sent if "1007" in t]) == 1, sent  # the owner's notice, once
    assert store.get_run(audit_id)["status"] == "ok", store.get_run(audit_id)
    assert _answer(server, run_id, "admin", "Reject")[0] in (403, 409)  # answered: no second answer
