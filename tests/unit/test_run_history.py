"""Runs are history too: every status change is a new row, ``gpu_cost_runs`` the view of the current state;
a decision's approval comes from an approval event only.

The same checks, under the real roles (the agent may neither change a run's row nor write an approval),
run on PostgreSQL in ``tests/integration/test_grants.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore, decision_row
from gpu_cost.core.model import Decision

T0 = 1_780_000_000.0


@pytest.fixture
def mem_store() -> AuditStore:
    return AuditStore("sqlite:///:memory:").ensure_schema()


def run_story(store: AuditStore, run_id: str) -> list[tuple[str, Any]]:
    """Start a run, ask a human, finish it, finish it again (a retried ``finish``): the view after each step."""
    seen = []
    store.begin_run(run_id, dag_id="gpu_zombie_sweep", started_at=T0, data_ts=T0 - 60, source="sim", mode="enforce")
    seen.append((store.get_run(run_id)["status"], store.get_run(run_id)["finished_at"]))
    store.begin_run(run_id, dag_id="other", started_at=T0 + 5, data_ts=T0, source="x", mode="dry-run")  # ignored
    store.execute("mark_run_awaiting", {"run_id": run_id})
    seen.append((store.get_run(run_id)["status"], store.get_run(run_id)["finished_at"]))
    store.finish_run(run_id, status="degraded", finished_at=T0 + 60, problems=["gpu02 stale"], counts={"acted": 0})
    seen.append((store.get_run(run_id)["status"], store.get_run(run_id)["finished_at"]))
    store.execute("mark_run_awaiting", {"run_id": run_id})  # only a running run waits for a human
    store.finish_run(run_id, status="failed", finished_at=T0 + 90, problems=["1 action(s) failed"], counts={"acted": 1})
    seen.append((store.get_run(run_id)["status"], store.get_run(run_id)["finished_at"]))
    store.finish_run("no-such-run", status="ok", finished_at=T0)  # a run never begun gets no row
    return seen


def check_run_story(store: AuditStore, run_id: str) -> None:
    assert run_story(store, run_id) == [("running", None), ("awaiting_approval", None), ("degraded", T0 + 60),
                                        ("failed", T0 + 90)]
    run = store.get_run(run_id)
    assert (run["dag_id"], run["started_at"], run["data_ts"], run["source"], run["mode"]) == (
        "gpu_zombie_sweep", T0, T0 - 60, "sim", "enforce")  # as begun: the second begin changed nothing
    assert (json.loads(run["problems"]), json.loads(run["counts"])) == (["1 action(s) failed"], {"acted": 1})
    events = store.query("SELECT status, finished_at FROM gpu_cost_run_events WHERE run_id = :r ORDER BY event_id",
                         {"r": run_id})
    assert [(e["status"], e["finished_at"]) for e in events] == [
        ("awaiting_approval", None), ("degraded", T0 + 60), ("failed", T0 + 90)]
    assert store.get_run("no-such-run") is None
    assert [r["run_id"] for r in store.fetch("running_runs", {"dag_id": "gpu_zombie_sweep", "run_id": "x",
                                                              "since": T0 - 1})] == []


def test_every_status_change_of_a_run_is_a_new_row(mem_store: AuditStore) -> None:
    check_run_story(mem_store, "gpu_zombie_sweep:r1")


def test_a_decision_is_approved_only_by_an_approval_event(mem_store: AuditStore) -> None:
    """A log row that says "approved" (only the agent writes the log) approves nothing; an approval event does."""
    d = Decision(decision_id="d1", ts=T0, rule="idle_allocation", target_kind="job", target="job:7", action="cancel",
                 mode="enforce", requires_approval=True, gpus=4, reason="idle")
    forged = {**decision_row(d, "r1"), "approval_status": "approved"}
    mem_store.execute("insert_decision", forged)
    assert mem_store.get_decision("d1")["approval_status"] is None
    mem_store.execute("insert_decision", {**forged, "decision_id": "d2", "approval_status": "pending"})
    assert mem_store.get_decision("d2")["approval_status"] == "pending"
    mem_store.set_approval("d1", "approved", "lead", T0 + 60)
    got = mem_store.get_decision("d1")
    assert (got["approval_status"], got["approved_by"], got["approved_at"]) == ("approved", "lead", T0 + 60)
