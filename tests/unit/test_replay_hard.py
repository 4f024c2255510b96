"""Replays of a generated trace with the hard behaviours (a serving fleet that wakes rarely, checkpoint
pauses, data loading, finished and crashed jobs that keep their GPUs, zombies, sessions): the class
baselines and the evidence beyond utilisation stop the false kills and the notices the rules alone make,
and lose nothing the rules alone find.

One trace, two replays (baselines on and off), shared by the tests of this module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpu_cost.cli.commands.simtrace import write_sim_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.sim.replay import replay_files

END = 1795392000.0  # a fixed instant: the same trace on every run


@pytest.fixture(scope="module")
def hard(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("hard")
    write_sim_trace(out, days=1.5, gpus=32, seed=0, end=END, behaviours="hard")
    policy = load_policy(None)
    alone = dataclasses.replace(policy, baselines=dataclasses.replace(policy.baselines, enabled=False))
    object.__setattr__(alone, "source", policy.source)
    on = replay_files(out / "samples.parquet", out / "jobs.csv", policy).to_dict()
    off = replay_files(out / "samples.parquet", out / "jobs.csv", alone).to_dict()
    return {"dir": out, "on": on, "off": off, "jobs": pd.read_csv(out / "jobs.csv")}


def test_the_trace_has_every_hard_behaviour_and_its_logs(hard: dict[str, Any]) -> None:
    behaviours = set(hard["jobs"]["behaviour"])
    assert {"service", "checkpoint", "dataload", "finished", "crashed", "interactive", "zombie"} <= behaviours
    assert "job logs read from" in hard["on"]["notes"][0]  # logs.csv beside jobs.csv is read by default


def test_quiet_endpoints_are_never_killed_and_the_baselines_stop_nagging_their_owners(hard: dict[str, Any]) -> None:
    """Judged alone, a quiet endpoint looks abandoned. Its model stays resident, so with no class that tells, the
    agent is unsure of it and only writes to its owner and manager (before, memory held and a quiet log came to
    exactly min_confidence, and once someone approved it was terminated: 4 endpoints killed, 1 with the baselines
    on). The class baselines see a service and advise instead: a third of the notices."""
    on, off = hard["on"], hard["off"]
    services = set(hard["jobs"].loc[hard["jobs"]["behaviour"] == "service", "job_id"].astype(str))
    for replay in (on, off):
        assert replay["by_behaviour"]["service"]["killed"] == 0 and replay["false_kills"] == 0
        assert not replay["reclaimed_by_kind"].get("service")

    def notices(replay: dict[str, Any]) -> list[dict[str, Any]]:
        return [a for a in replay["actions"] if str(a["job_id"]) in services and a["action"] in ("notify",
                                                                                              "notify_manager")]

    assert len({a["job_id"] for a in notices(off)}) >= 3  # judged alone, every quiet endpoint is nagged
    assert 2 * len(notices(on)) < len(notices(off))


def test_nothing_the_rules_alone_find_is_lost(hard: dict[str, Any]) -> None:
    on, off = hard["on"]["by_behaviour"], hard["off"]["by_behaviour"]
    for beh in ("zombie", "finished", "crashed", "idle"):
        if beh not in off:
            continue
        assert on[beh]["found"] >= off[beh]["found"], beh
        assert on[beh]["killed"] >= off[beh]["killed"], beh
        if off[beh]["median_first_notice_s"] is not None:
            assert on[beh]["median_first_notice_s"] <= off[beh]["median_first_notice_s"], beh


def test_progress_is_not_waste(hard: dict[str, Any]) -> None:
    on = hard["on"]
    jobs = hard["jobs"]
    checkpoint = set(jobs.loc[jobs["behaviour"] == "checkpoint", "job_id"].astype(str))
    assert checkpoint
    flagged = {str(a["job_id"]) for a in on["actions"] if a["rule"] == "idle_allocation"}
    assert not flagged & checkpoint  # a checkpoint pause writes its log: never an idle finding
    kills = {str(a["job_id"]) for a in on["actions"] if a["action"] in ("terminate", "kill", "cancel")}
    loading = set(jobs.loc[jobs["behaviour"].isin(["dataload", "interactive", "checkpoint"]), "job_id"].astype(str))
    assert not kills & loading


def test_replay_reports_the_trade_off(hard: dict[str, Any]) -> None:
    on = hard["on"]
    assert set(on["reclaimed_by_kind"]) <= {"service", "training", "interactive"}
    assert on["idle_acted_share"] is not None and 0 < on["idle_acted_share"] <= 1
    assert on["reclaimed_by_kind"].get("training", 0) > 0


def test_audit_shows_the_evidence_of_a_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As an operator runs it: a sweep, then ``gpu-cost audit --job ID`` shows what was read and why it counted."""
    import json

    from gpu_cost.cli.main import main

    db = f"sqlite:///{tmp_path / 'audit.db'}"
    assert main(["sweep", "--source", "sim", "--db", db, "--json"]) == 0
    sweep = json.loads(capsys.readouterr().out)
    idle = [d for d in sweep["decisions"] if d["rule"] == "idle_allocation"]
    assert idle, sweep["decisions"]
    assert main(["audit", "--job", str(idle[0]["job_id"]), "--db", db]) == 0
    text = capsys.readouterr().out
    assert "evidence: GPU utilisation: max" in text
    assert "confidence: 0." in text and "utilisation alone" in text
    assert "utilisation over the lookback: " in text
    assert main(["audit", "--job", str(idle[0]["job_id"]), "--db", db, "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)["decisions"][0]
    assert entry["evidence"]["signals"][0]["what"] == "GPU utilisation"
    assert 0 <= entry["evidence"]["confidence"] <= 1


@pytest.mark.parametrize("seed", [0, 5, 6])
def test_no_generated_hard_day_kills_a_service(tmp_path: Path, seed: int) -> None:
    """Generated hard days (32 GPUs, the shipped policy, approvals granted): no false kill, and every kill of a
    job is of a job that finished, crashed or sat idle. (Before, these three days killed 5 endpoints that held
    their model and wrote nothing while they waited: 3 of 6 kills on seed 5.)"""
    write_sim_trace(tmp_path, days=1.0, gpus=32, seed=seed, end=END, behaviours="hard")
    res = replay_files(tmp_path / "samples.parquet", tmp_path / "jobs.csv", load_policy(None)).to_dict()
    jobs = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str})
    behaviour = dict(zip(jobs["job_id"], jobs["behaviour"], strict=True))
    assert res["false_kills"] == 0
    for a in res["actions"]:
        if a["action"] in ("terminate", "kill", "cancel"):
            assert behaviour[str(a["job_id"])] in ("finished", "crashed", "idle"), a
