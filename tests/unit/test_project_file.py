"""The project file (``gpu-cost.toml``) the demo leaves, and what the demo's summary says about it.

- ``gpu-cost demo`` names its store in the working directory's project file when there is none (or
  it names the demo's store already); it never rewrites one that names something else, and then
  its summary and next commands say ``--db``;
- the summary's forecast lines say what was forecast and what the figures mean;
- through the real console script: after the demo's store exists, ``power plan`` creates no other
  store and ``audit --job`` still reads the demo's (issue 39).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.cli import options, project
from gpu_cost.cli.commands import demo
from tests.fixtures.core import NOW, ROOT

CONN_ENV = "AIRFLOW_CONN_GPU_COST_DB"


@pytest.fixture
def bare_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No store configured anywhere; GPU_COST_HOME an empty folder; the working directory an empty folder."""
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("GPU_COST_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(options.DB_ENV, raising=False)
    monkeypatch.delenv(CONN_ENV, raising=False)
    monkeypatch.setenv("GPU_COST_AIRFLOW_LOOKUP", "0")
    monkeypatch.chdir(work)
    return work


# -- the demo names its store ------------------------------------------------------------------------


def test_the_demo_writes_a_project_file_naming_its_store(bare_env: Path) -> None:
    db = bare_env / ".demo" / "audit.db"
    out = project.name_store(bare_env, db)
    pfile = bare_env / project.FILE_NAME
    assert out == {"file": str(pfile), "written": True, "names_it": True, "note": None}
    assert project.read(pfile) == {"store": {"db": ".demo/audit.db"}}  # relative: the folder may move
    assert options.resolve_store(None) == options.StoreChoice(f"sqlite:///{db}", "project", str(pfile))
    before = pfile.read_text(encoding="utf-8")
    again = project.name_store(bare_env, db)  # a second demo: the file names it already
    assert (again["written"], again["names_it"]) == (False, True) and pfile.read_text(encoding="utf-8") == before


def test_a_store_outside_the_folder_is_named_by_its_absolute_path(bare_env: Path, tmp_path: Path) -> None:
    db = tmp_path / "elsewhere" / "audit.db"
    project.name_store(bare_env, db)
    assert project.store_db(bare_env / project.FILE_NAME) == str(db)


@pytest.mark.parametrize("body", ['[store]\ndb = "team.db"\n', "[store\n", "# nothing named\n"],
                         ids=["another-store", "malformed", "no-store"])
def test_the_demo_leaves_a_project_file_naming_something_else_alone(bare_env: Path, body: str) -> None:
    pfile = bare_env / project.FILE_NAME
    pfile.write_text(body, encoding="utf-8")
    out = project.name_store(bare_env, bare_env / ".demo" / "audit.db")
    assert (out["written"], out["names_it"]) == (False, False) and out["note"]
    assert pfile.read_text(encoding="utf-8") == body


def _result(home: Path, **extra: Any) -> dict[str, Any]:
    """Return the least of a demo result the summary reads."""
    return {"mode": "dry-run", "cluster": {"gpus": 88, "nodes": 11}, "audit_job": "1003",
            "decisions": [{"rule": "idle_allocation", "target": "job:1003", "job_id": "1003", "user": "carol",
                           "action": "notify", "reason": "idle"}],
            "audit_db": str(home / "audit.db"), "log": str(home / "demo.log"), **extra}


def test_the_summary_says_how_to_reach_the_demos_store_when_the_project_file_names_another(bare_env: Path) -> None:
    home = bare_env / ".demo"
    (bare_env / project.FILE_NAME).write_text('[store]\ndb = "team.db"\n', encoding="utf-8")
    result = _result(home, project_file=demo._name_store(home / "audit.db"))
    assert result["project_file"]["reads_demo_store"] is False
    text = "\n".join(demo.summary(result, home))
    assert (f"later commands here read sqlite:///{bare_env / 'team.db'} (project file "
            f"{bare_env / project.FILE_NAME}): add --db .demo/audit.db to read the demo's") in text
    cmds = [cmd for cmd, _ in demo.next_commands(result, home)]
    assert cmds[0].endswith("audit --job 1003 --db .demo/audit.db") and cmds[1].endswith("--db .demo/audit.db")


def test_the_summary_says_the_project_file_names_the_store(bare_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = bare_env / ".demo"
    result = _result(home, project_file=demo._name_store(home / "audit.db"))
    text = "\n".join(demo.summary(result, home))
    assert f"{bare_env / project.FILE_NAME} names it: later gpu-cost commands in this folder (or below) read it" in text
    assert all("--db" not in cmd for cmd, _ in demo.next_commands(result, home))
    # GPU_COST_DB comes before the project file: the summary says so, and what to type
    monkeypatch.setenv(options.DB_ENV, str(bare_env / "ops.db"))
    result = _result(home, project_file=demo._name_store(home / "audit.db"))
    assert "later commands here read sqlite:///" in "\n".join(demo.summary(result, home))
    assert demo.next_commands(result, home)[0][0].endswith("--db .demo/audit.db")


def test_the_forecast_lines_say_what_was_forecast_and_what_the_figures_mean() -> None:
    figures = {"demand": {"series": 9, "validation_smape": 66.91, "seasonal_naive_smape": 109.7},
               "runtime": {"classes": 2790, "running_jobs": 32,
                           "backtest": {"mae_s": 3.14 * 3600, "baseline_limit_mae_s": 14.51 * 3600}}}
    lines = demo.forecast_lines(figures)
    assert lines == [
        "forecast  GPUs demanded per hour, 9 series (cluster, partitions, accounts): error 67 on past hours held out "
        "of the fit, vs 110 for \"same hour last week\" (sMAPE, 0-200, lower is better)",
        "          job end times: 2,790 job classes learnt, an ETA for each of 32 running jobs; on the last 7 days' "
        "jobs (held out) off by 3.1 h on average, vs 14.5 h for \"runs to its time limit\""]
    short = demo.forecast_lines({"demand": {"series": 2}, "runtime": {}})
    assert short[0] == "forecast  GPUs demanded per hour, 2 series: too little history to score it"


# -- the real console script --------------------------------------------------------------------------


@pytest.mark.slow  # four CLI subprocesses
def test_the_console_script_keeps_reading_the_demos_store_after_power_plan(tmp_path: Path) -> None:
    """Issue 39 as a new user met it: `power plan` created ~/.gpu_cost/audit.db, and from then on
    `audit --job 1003` read that empty store ("no decision recorded", exit 0)."""
    exe = ROOT / ".venv" / "bin" / "gpu-cost"
    assert exe.is_file(), f"{exe}: run make setup"
    work, home = tmp_path / "work", tmp_path / "home"
    (work / "sub").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in (CONN_ENV, options.DB_ENV)}
    env.update(GPU_COST_HOME=str(home), GPU_COST_AIRFLOW_LOOKUP="0")
    project.name_store(work, work / ".demo" / "audit.db")  # as `gpu-cost demo` leaves it

    def gpu_cost(*argv: str, cwd: Path = work) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(exe), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)

    sweep = gpu_cost("sweep", "--source", "sim", "--mode", "dry-run", "--at", str(NOW), "--json")
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    db = work / ".demo" / "audit.db"
    pfile = work / project.FILE_NAME
    assert json.loads(sweep.stdout)["store"] == {"url": f"sqlite:///{db}", "origin": "project", "file": str(pfile)}
    label = f"store: sqlite:///{db} (project file {pfile})"

    plan = gpu_cost("power", "plan", "--source", "sim", "--at", str(NOW))
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert plan.stdout.rstrip("\n").splitlines()[-1] == label
    assert not home.exists() or not (home / "audit.db").exists(), "a read created the default store"

    audit = gpu_cost("audit", "--job", "1003", cwd=work / "sub")  # from below the folder too
    assert audit.returncode == 0, audit.stderr[-2000:]
    lines = audit.stdout.rstrip("\n").splitlines()
    assert "decision(s) for job 1003" in lines[0] and lines[-1] == label
    missing = gpu_cost("audit", "--job", "999999")
    assert missing.returncode == 1 and missing.stdout.splitlines()[0] == "no decision recorded for job 999999"
