"""Hostile strings (shell metacharacters, quotes, newlines, unicode, 10 kB) flow through the whole
chain — scheduler record → rules → decisions → audit row → notification text — unharmed and inert."""

from __future__ import annotations

import json

from gpu_cost.act.notices.render import render
from gpu_cost.audit.store import AuditStore
from gpu_cost.loop.sweep import run_once
from gpu_cost.sim.cluster import scenario_from_dict
from tests.fixtures.core import NOW

NASTY_NAME = "x\"; rm -rf / #$(reboot)`id` 'q' \\ & | > < 名前 🚀\nsecond line"
NASTY_USER = "o'brien$(id)"
NASTY_COMMENT = "gpu-cost:note " + "A" * 10_000


def test_hostile_strings_survive_every_step(tmp_path, policy) -> None:  # type: ignore[no-untyped-def]
    scenario = scenario_from_dict({
        "seed": 1, "anchor": "now",
        "nodes": [{"name": "g1", "gpus": 2, "mem_total_mib": 40960}],
        "jobs": [{"job_id": "77", "user": NASTY_USER, "account": "acct;drop table", "name": NASTY_NAME,
                  "comment": NASTY_COMMENT, "behaviour": "idle", "node": "g1", "gpus": [0, 1], "start": "-3h",
                  "busy_first": "30m"}],
    })
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}").ensure_schema()
    out = run_once(policy, NOW, store, run_id="hostile", source="sim", scenario=scenario)
    idle = [d for d in out["decisions"] if d["rule"] == "idle_allocation"]
    assert idle and idle[0]["user"] == NASTY_USER and idle[0]["job_id"] == "77"
    row = store.decisions_of_run("hostile")[0]
    assert row["user_name"] == NASTY_USER and row["account"] == "acct;drop table"
    assert json.loads(row["evidence"])["job_name"] == NASTY_NAME  # stored byte for byte
    assert store.table_counts()["gpu_cost_decisions"] >= 1  # the SQL was not broken by the quotes
    from gpu_cost.core.model import Decision

    decision = Decision.from_dict({**{k: row[k] for k in ("decision_id", "rule", "target_kind", "target", "action",
                                                          "mode", "rung", "episode", "job_id", "gpus", "reason")},
                                   "ts": NOW, "user": row["user_name"], "account": row["account"],
                                   "evidence": json.loads(row["evidence"])})
    msg = render(decision, policy, NOW)
    assert "\n" not in msg.subject, "a newline in a name must not inject e-mail headers"
    assert "<@" not in msg.text  # nobody has a Slack handle here, so no mention can appear
    assert "名前" in msg.text and "🚀" in msg.text  # unicode kept
    assert "rm -rf" in msg.html and "&lt; 名前" in msg.html  # shown, but HTML-escaped
    assert "> < 名前" not in msg.html
