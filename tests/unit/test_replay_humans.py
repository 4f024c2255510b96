"""The replay says what a human was asked: every destructive rung that needed one, with the confidence
it showed, and ``--approvals owner``: only the owner's own release lets anything destructive happen."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.cli.commands.simtrace import write_scenario_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.config.schema import Caps
from gpu_cost.core.errors import TraceError
from gpu_cost.sim.cluster import scenario_from_dict
from gpu_cost.sim.replay import replay_files
from tests.fixtures.core import ROOT

END = 1795910400.0
DAY = 86400.0
JOBS = [
    # idle after 30 min of work, labelled approval-required: its destructive rungs wait for a human
    {"job_id": "201", "user": "ann", "behaviour": "idle", "node": "g1", "gpus": [0], "start": "-20h",
     "busy_first": "30m", "comment": "gpu-cost:approval-required", "name": "finetune"},
    # the same, unlabelled: its destructive rungs are automatic
    {"job_id": "202", "user": "bob", "behaviour": "idle", "node": "g1", "gpus": [1], "start": "-20h",
     "busy_first": "30m", "name": "eval"},
    {"job_id": "203", "user": "cat", "behaviour": "training", "node": "g1", "gpus": [2, 3], "start": "-20h",
     "name": "train"},
]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("humans")
    sc = scenario_from_dict({"seed": 5, "anchor": END, "jobs": JOBS,
                             "nodes": [{"name": "g1", "gpus": 4, "model": "a100", "mem_total_mib": 40960}]})
    write_scenario_trace(out, sc, END - DAY, END)
    return out


@pytest.fixture(scope="module")
def policy() -> Any:
    shipped = load_policy(ROOT / "include" / "policy" / "default.yaml")
    p = dataclasses.replace(shipped, caps=Caps(max_actions_per_run=20, max_gpu_share=0.5))
    object.__setattr__(p, "source", shipped.source)
    return p


def run(trace: Path, policy: Any, approvals: str, store: Any = None) -> dict[str, Any]:
    return replay_files(trace / "samples.parquet", trace / "jobs.csv", policy, approvals=approvals,
                        store=store).to_dict()


def destructive(res: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a["target"], a["action"]) for a in res["actions"] if a["action"] in ("demote", "terminate", "kill")]


def test_every_destructive_rung_a_human_approved_is_listed_with_its_confidence(trace: Path, policy: Any) -> None:
    res = run(trace, policy, "approve")
    asked = res["human_asked"]
    assert res["human_asked_count"] == len(asked) > 0
    assert {a["target"] for a in asked} == {"job:201"}  # 202's rungs needed nobody
    assert [a["action"] for a in asked] == ["demote", "terminate"]  # a terminate ends the job in the replay
    for a in asked:
        assert 0 <= a["confidence"] <= 1 and a["asked"] == "approver" and a["answer"] == "approved"
        assert a["kind"] and a["ts"] and a["rung"] >= 2 and "approval required (protection approval label)" in a["reason"]
    assert ("job:201", "terminate") in destructive(res) and ("job:202", "terminate") in destructive(res)


def test_a_rejected_rung_is_listed_once_and_nothing_follows(trace: Path, policy: Any) -> None:
    res = run(trace, policy, "reject")
    assert [(a["target"], a["action"], a["answer"]) for a in res["human_asked"]] == [("job:201", "demote", "rejected")]
    assert not [t for t, _ in destructive(res) if t == "job:201"] and ("job:202", "terminate") in destructive(res)


def test_owner_approvals_without_a_release_do_nothing_destructive(trace: Path, policy: Any) -> None:
    res = run(trace, policy, "owner")
    assert destructive(res) == [] and res["kills"] == 0
    asked = [(a["target"], a["action"], a["asked"], a["answer"]) for a in res["human_asked"]]
    # each target's first destructive rung, asked of its owner once (the ladder waits on the answer)
    assert asked == [("job:201", "demote", "owner", "no release by the owner"),
                     ("job:202", "demote", "owner", "no release by the owner")]
    assert any(a["action"] == "notify_manager" for a in res["actions"])  # the notices still go out


def test_owner_approvals_act_once_the_owner_released(trace: Path, policy: Any, tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'a.db'}").ensure_schema()
    store.execute("insert_answer", {
        "answer_id": "0000000000001-release", "ts": END - DAY, "channel": "link", "choice": "release",
        "status": "accepted", "refusal": None, "decision_id": "d-202", "rule": "idle_allocation", "target": "job:202",
        "episode": 1, "job_id": "202", "answered_by": "bob", "owner": "bob", "role": "owner", "duration_s": None,
        "reason": "done with it", "until_ts": None, "effect": "gpu_manual_reclaim run r1", "nonce": "n1"})
    res = run(trace, policy, "owner", store)
    assert {t for t, _ in destructive(res)} == {"job:202"} and res["kills"] == 1
    answers = {a["target"]: a["answer"] for a in res["human_asked"]}
    assert answers["job:202"] == "released by the owner" and answers["job:201"] == "no release by the owner"


def test_an_unknown_way_of_answering_is_refused(trace: Path, policy: Any) -> None:
    with pytest.raises(TraceError, match="approvals must be one of approve, reject, owner"):
        run(trace, policy, "manager")


@pytest.mark.slow  # a CLI subprocess
def test_the_cli_takes_owner_approvals(trace: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "replay", "--samples", str(trace / "samples.parquet"),
                        "--jobs", str(trace / "jobs.csv"), "--approvals", "owner", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["human_asked_count"] == len(out["human_asked"]) and out["kills"] == 0
