"""``gpu-cost audit``: the trail of a job, target or user, read back as an operator asks for it.

The store is filled the way the sweep fills it (plan, record, dispatch through a test executor,
one decision approved by hand, one rejected), on SQLite here and on the real PostgreSQL in
``tests/integration/test_audit_trail_postgres.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.audit.trail import trail
from gpu_cost.cli import main as cli
from gpu_cost.core.timeutil import iso
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

POLICY = """
mode: enforce
approval: {gpu_hours_at_risk: 10}
rules:
  idle_allocation: {ladder: [{action: notify}, {action: terminate, after: 1h}]}
  zombie: {ladder: [{action: notify}]}
"""


def fill(store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Three sweeps: ann's small job is notified then terminated, bo's big job notified then its
    terminate waits for approval and is rejected, and cy's zombie process is notified."""
    effects = Effects()
    install(monkeypatch, effects)
    policy = policy_from(POLICY)
    small = lambda t: job_finding("41", user="ann", gpus=1, ran_s=2 * H + (t - NOW), now=t)  # noqa: E731
    big = lambda t: job_finding("42", user="bo", gpus=8, ran_s=2 * H + (t - NOW), now=t)  # noqa: E731
    sweep_once(store, policy, [small(NOW), big(NOW), process_finding(4343, user="cy", now=NOW)], NOW)
    p = sweep_once(store, policy, [small(NOW + H), big(NOW + H)], NOW + H, approve=False)
    asked = next(d for d in p.decisions if d.job_id == "42")
    store.set_approval(asked.decision_id, "rejected", "dana", NOW + H + 600)
    store.set_decision_status(asked.decision_id, "rejected")
    return {"asked": asked, "effects": effects}


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], store: AuditStore,
         *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": store.url.split("///", 1)[1]}))
    code = cli.main(["audit", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_jobs_trail_tells_what_was_done_and_why(store, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    fill(store, monkeypatch)
    code, out, _ = _cli(monkeypatch, capsys, store, "--job", "41", "--json")
    assert code == 0
    got = json.loads(out)
    assert got["filters"] == {"job": "41"} and got["count"] == 2
    first, second = got["decisions"]
    assert (first["action"], first["rung"], first["ts"], first["status"]) == ("notify", 0, iso(NOW), "acted")
    assert (second["action"], second["rung"], second["ts"], second["status"]) == ("terminate", 1, iso(NOW + H), "acted")
    assert second["reason"] and second["user"] == "ann" and second["approval"] is None
    (act,) = second["actions"]
    assert act["status"] == "succeeded" and act["command"] == "terminate job:41" and not act["dry_run"]
    # a terminate frees the GPU, credited no longer than it had been seen idle: 1 h since the first
    # finding plus the rule's 15 min window (its time limit was 46 h away)
    (saved,) = second["savings"]
    assert saved["gpu_hours"] == 1.25 and "waste already seen (1.25 h)" in saved["basis"], saved
    # the same as text, for a person
    code, text, _ = _cli(monkeypatch, capsys, store, "--job", "41")
    assert code == 0 and text.startswith("2 decision(s) for job 41, oldest first:")
    assert "idle_allocation rung 1 (episode 1): terminate [enforce] → acted" in text
    assert "action terminate → succeeded" in text and "saved: " in text and " USD (" in text


def test_a_rejected_approval_shows_who_and_that_nothing_ran(store, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    asked = fill(store, monkeypatch)["asked"]
    code, out, _ = _cli(monkeypatch, capsys, store, "--target", "job:42", "--json")
    assert code == 0
    last = json.loads(out)["decisions"][-1]
    assert last["decision_id"] == asked.decision_id and last["action"] == "terminate"
    assert last["approval"] == {"status": "rejected", "by": "dana", "at": iso(NOW + H + 600)}
    assert last["status"] == "rejected" and last["actions"] == [] and last["savings"] == []
    assert last["gpu_hours_at_risk"] > 10
    code, text, _ = _cli(monkeypatch, capsys, store, "--target", "job:42")
    assert code == 0 and f"approval: rejected by dana at {iso(NOW + H + 600)}" in text


def test_filters_combine_and_the_limit_keeps_the_newest(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    fill(store, monkeypatch)
    assert {e["target"] for e in trail(store)} == {"job:41", "job:42", f"proc:g1:4343:{int(NOW - H)}"}
    assert {e["user"] for e in trail(store, user="cy")} == {"cy"}
    assert [e["rule"] for e in trail(store, user="cy", rule="zombie")] == ["zombie"]
    assert trail(store, user="cy", rule="idle_allocation") == []
    later = trail(store, since=NOW + 1)
    assert later and all(e["ts"] == iso(NOW + H) for e in later)
    newest = trail(store, limit=2)
    assert [e["ts"] for e in newest] == [iso(NOW + H)] * 2  # the two newest, in time order


def test_since_as_a_duration_and_bad_input(store, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    fill(store, monkeypatch)
    code, out, _ = _cli(monkeypatch, capsys, store, "--since", "1h", "--json")
    assert code == 1 and json.loads(out)["count"] == 0  # NOW is in the past of the test's clock: nothing found
    code, out, err = _cli(monkeypatch, capsys, store, "--since", "last tuesday", "--json")
    assert code == 2 and "--since 'last tuesday'" in json.loads(out)["error"] and "--since" in err
    code, out, _ = _cli(monkeypatch, capsys, store, "--limit", "0", "--json")
    assert code == 2 and "--limit 0" in json.loads(out)["error"]
    code, text, _ = _cli(monkeypatch, capsys, store, "--job", "4242")
    assert code == 1 and text.splitlines()[0] == "no decision recorded for job 4242"
    assert text.splitlines()[-1].startswith("store: sqlite:///")  # every command says which store it read
