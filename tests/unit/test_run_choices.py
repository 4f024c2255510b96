"""What a run's form choices mean when the run starts: the source word maps back, unknown names are refused.

The forms offer the word ``configured`` for the data source and suggest the shipped policy and
search space names; the first task of a run maps the word (and an older conf's None) back to the
deployment's source, and refuses a typed name its folder does not hold, naming the ones it does.
"""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pendulum
import pytest
from airflow.sdk.exceptions import AirflowFailException

from gpu_cost.airflow import forecast_tasks, runtime, sweep_tasks, tune_tasks
from tests.fixtures.core import ROOT

WHEN = pendulum.datetime(2026, 11, 30, 2, 0, tz="UTC")


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A policy folder (the shipped default and ``team-a``, whose source is prometheus) and a tune folder."""
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "a.db")}))
    for var in ("GPU_COST_SOURCE", "GPU_COST_FORECAST_SOURCE", "GPU_COST_POLICY"):
        monkeypatch.delenv(var, raising=False)
    policies, spaces = tmp_path / "policies", tmp_path / "spaces"
    policies.mkdir()
    spaces.mkdir()
    shutil.copy(ROOT / "include" / "policy" / "default.yaml", policies)
    (policies / "team-a.yaml").write_text("sweep: {source: prometheus}\n")
    shutil.copy(ROOT / "include" / "tune" / "default.yaml", spaces)
    (spaces / "narrow.yaml").write_text("rules.zombie.window: [10m, 15m]\n")
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(policies))
    monkeypatch.setenv(tune_tasks.TUNE_DIR_ENV, str(spaces))
    monkeypatch.setenv("GPU_COST_REPORT_DIR", str(tmp_path / "reports"))
    return tmp_path


def _context(dag_id: str, run: str) -> dict[str, object]:
    return {"dag_run": types.SimpleNamespace(dag_id=dag_id, run_id=run, run_after=WHEN), "logical_date": WHEN}


@pytest.mark.parametrize("asked", [runtime.CONFIGURED_SOURCE, None, "absent"], ids=["word", "old-none", "absent"])
def test_the_word_and_an_older_runs_none_both_pick_the_policys_source(deployment: Path, asked: str | None) -> None:
    params = {"policy": "team-a"} | ({} if asked == "absent" else {"source": asked})
    cfg = sweep_tasks.check_policy(params, _context("gpu_zombie_sweep", f"r-{asked}"))
    assert cfg["source"] == "prometheus"  # team-a's sweep.source


def test_configured_means_the_environment_first_and_a_chosen_source_wins(deployment: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    policy = runtime.policy_from({"policy": "team-a"})
    monkeypatch.setenv("GPU_COST_SOURCE", "sim")
    assert runtime.source_from(policy, {"source": runtime.CONFIGURED_SOURCE}) == "sim"
    assert runtime.source_from(policy, {"source": None}) == "sim"
    assert runtime.source_from(policy, {"source": "trace"}) == "trace"
    # the nightly forecast reads its own variable first, then the sweep's, then the policy's
    assert runtime.source_from(policy, {"source": runtime.CONFIGURED_SOURCE}, env=forecast_tasks.SOURCE_ENV) == "sim"
    monkeypatch.setenv("GPU_COST_FORECAST_SOURCE", "store")
    assert runtime.source_from(policy, {"source": runtime.CONFIGURED_SOURCE}, env=forecast_tasks.SOURCE_ENV) == "store"
    monkeypatch.delenv("GPU_COST_SOURCE")
    monkeypatch.delenv("GPU_COST_FORECAST_SOURCE")
    assert runtime.source_from(policy, {}, env=forecast_tasks.SOURCE_ENV) == "prometheus"


def test_a_typed_policy_the_folder_lacks_fails_the_first_task_naming_the_ones_it_holds(deployment: Path) -> None:
    with pytest.raises(AirflowFailException, match=r"team-b: policy: not a policy of .*available: default, team-a\)"):
        sweep_tasks.check_policy({"policy": "team-b", "source": runtime.CONFIGURED_SOURCE},
                                 _context("gpu_zombie_sweep", "typed-policy"))


def test_a_typed_search_space_the_folder_lacks_fails_plan_naming_the_ones_it_holds(deployment: Path) -> None:
    ctx = _context("gpu_policy_tune", "typed-space")
    with pytest.raises(AirflowFailException, match=r"wide: space: not a search space of .*available: default, narrow\)"):
        tune_tasks.plan({"space": "wide", "days": 7, "policy": "default"}, ctx)
    # a space typed after the DAG file was parsed is found when the run starts
    (deployment / "spaces" / "wide.yaml").write_text("rules.zombie.window: [10m, 30m]\n")
    assert tune_tasks.plan({"space": "wide", "days": 7, "policy": "default"}, _context("gpu_policy_tune", "r2"))[
        "space"] == "wide"
