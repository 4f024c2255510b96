"""Every DAG file parses like the DAG processor parses it: no import errors, nothing at parse time."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.fixtures.core import ROOT

DAG_FILES = sorted(p.name for p in (ROOT / "dags").glob("*.py") if not p.name.startswith("_"))


def test_no_import_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}
    assert len(dagbag.dags) >= len(DAG_FILES)


def test_one_dag_per_file_named_after_it(dagbag) -> None:  # type: ignore[no-untyped-def]
    ids = {d.dag_id for d in dagbag.dags.values()}
    for name in DAG_FILES:
        assert name[:-3] in ids, f"{name} should define the DAG {name[:-3]}"


@pytest.mark.parametrize("dag_file", DAG_FILES)
def test_dag_conventions(dagbag, dag_file: str) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.dags[dag_file[:-3]]
    assert "gpu-cost" in dag.tags
    assert dag.doc_md and len(dag.doc_md) > 200, "the DAG docstring tells operators what it does and how to triage"
    assert dag.catchup is False
    assert dag.start_date is not None and dag.start_date.tzinfo is not None
    for t in dag.tasks:
        assert t.owner == "gpu-platform", f"{t.task_id} owner"
        assert t.retries >= 1 or getattr(t, "_is_hitl", False) or t.task_type.endswith("ApprovalOperator") or t.task_type.startswith("HITL"), f"{t.task_id} retries"


def test_sweep_runs_on_while_one_waits_for_approval(dagbag) -> None:  # type: ignore[no-untyped-def]
    """A run waiting on a human (up to the 1 h default timeout = 12 sweeps) must not hold up the next sweeps."""
    assert dagbag.dags["gpu_zombie_sweep"].max_active_runs >= 13


PARSE_PROBE = textwrap.dedent(
    """
    import os, sys, json
    calls = []
    import airflow.sdk
    from airflow.sdk import BaseHook, Variable, Connection
    def boom(*a, **k):
        calls.append(repr(a[:1]))
        raise RuntimeError("connection/variable lookup at parse time")
    BaseHook.get_connection = classmethod(boom)
    Connection.get = classmethod(boom)
    Variable.get = staticmethod(boom)
    import sqlalchemy.engine
    real_connect = sqlalchemy.engine.Engine.connect
    def counting_connect(self, *a, **k):
        if "gpu_cost" in str(self.url) or "audit" in str(self.url):
            calls.append("audit-db")
        return real_connect(self, *a, **k)
    sqlalchemy.engine.Engine.connect = counting_connect
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=sys.argv[1])
    heavy = [m for m in ("prophet", "matplotlib", "gpu_cost.perceive.prometheus", "paramiko") if m in sys.modules]
    print(json.dumps({"errors": {k: str(v)[:500] for k, v in bag.import_errors.items()}, "calls": calls,
                      "dags": sorted(bag.dags), "heavy": heavy}))
    """
)


@pytest.mark.slow  # parses every DAG file in subprocesses: more than ~5 s
def test_parse_does_no_lookups_and_no_heavy_imports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    probe = tmp_path / "probe.py"
    probe.write_text(PARSE_PROBE)
    env = dict(os.environ)
    env.pop("AIRFLOW_CONN_GPU_COST_DB", None)
    r = subprocess.run([sys.executable, str(probe), str(ROOT / "dags")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["errors"] == {}
    assert out["calls"] == [], "a DAG file looked up a connection/variable or opened the audit DB at parse time"
    assert out["heavy"] == [], f"heavy modules imported at parse time: {out['heavy']}"
    assert "gpu_zombie_sweep" in out["dags"]


def test_retry_delay_is_set(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag in dagbag.dags.values():
        for t in dag.tasks:
            if t.retries:
                assert t.retry_delay >= dt.timedelta(seconds=5)


SCHEDULE_PROBE = textwrap.dedent(
    """
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=sys.argv[1])
    print(json.dumps({d.dag_id: None if type(d.timetable).__name__ == "NullTimetable" else
                      str(getattr(d.timetable, "summary", d.timetable)) for d in bag.dags.values()}))
    """
)

SCHEDULE_KNOBS = {"gpu_zombie_sweep": "SWEEP", "gpu_forecast_nightly": "FORECAST", "gpu_offhours_power": "POWER",
                  "gpu_weekly_cost_report": "REPORT"}


@pytest.mark.slow  # parses every DAG file in a subprocess: ~10 s
@pytest.mark.parametrize("value", ["none", "17 3 * * *"])
def test_every_scheduled_dag_has_an_environment_schedule_knob(tmp_path, value: str) -> None:  # type: ignore[no-untyped-def]
    """Test clusters switch schedules off, so no run appears that depends on today's date."""
    probe = tmp_path / "probe.py"
    probe.write_text(SCHEDULE_PROBE)
    env = {**os.environ, **{f"GPU_COST_{k}_SCHEDULE": value for k in SCHEDULE_KNOBS.values()}}
    r = subprocess.run([sys.executable, str(probe), str(ROOT / "dags")], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    summaries = json.loads(r.stdout.strip().splitlines()[-1])
    for dag_id in SCHEDULE_KNOBS:
        if value == "none":
            assert summaries[dag_id] is None, (dag_id, summaries[dag_id])
        else:
            assert "17 3 * * *" in summaries[dag_id], (dag_id, summaries[dag_id])
    assert summaries["gpu_manual_reclaim"] is None


#: what the sweep and the power DAG files must not load while parsed: the policy schema, the model, the
#: engine and the chat channels cost the DAG processor more than the rest of the file (tasks import them)
PARSE_LIGHT = ("gpu_cost.config.schema", "gpu_cost.core.model", "gpu_cost.decide.engine", "gpu_cost.act.channels.base")


@pytest.mark.slow  # one subprocess per DAG file
@pytest.mark.parametrize("dag_file", ["gpu_zombie_sweep.py", "gpu_offhours_power.py"], ids=["sweep", "power"])
def test_the_sweep_and_power_files_parse_without_the_library(dag_file: str) -> None:
    code = textwrap.dedent(f"""
        import json, sys
        import airflow.sdk
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder={str(ROOT / "dags" / dag_file)!r})
        print(json.dumps({{"errors": len(bag.import_errors), "dags": len(bag.dags),
                          "loaded": [m for m in {PARSE_LIGHT!r} if m in sys.modules]}}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["errors"] == 0 and out["dags"] == 1
    assert out["loaded"] == []
