"""An older run of a DAG, run after a newer one (cleared, backfilled, a late retry), leaves the newer results.

Through Airflow (``dag.test()``), each test on its own audit store:

* ``gpu_forecast_nightly``: the nightly of an older instant after the newer one leaves the newer
  right-sizing advice file (the one ``include/slurm/cli_filter.lua`` reads) as it is;
* ``gpu_zombie_sweep``: a sweep of an older instant after the newer one leaves every escalation ladder
  the newer one wrote as it is (not closed, not seen earlier, not restarted at rung -1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pendulum
import pytest
import yaml

from gpu_cost.audit.store import AuditStore
from gpu_cost.capacity import rightsize
from tests.fixtures.core import ROOT
from tests.unit.test_rightsize import history, still_running

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NEWER = pendulum.datetime(2026, 11, 30, 2, 0, tz="UTC")
OLDER = NEWER.subtract(days=2)


def _own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AuditStore:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")}))
    return AuditStore().ensure_schema()


def _policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **sections: dict[str, Any]) -> str:
    data = yaml.safe_load((ROOT / "include" / "policy" / "default.yaml").read_text())
    for name, values in sections.items():
        data[name].update(values)
    (tmp_path / "policies").mkdir(exist_ok=True)
    (tmp_path / "policies" / "older-runs.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path / "policies"))
    return "older-runs"


def test_an_older_nightly_leaves_the_newer_advice_file(airflow_db, dagbag, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = _own_store(tmp_path, monkeypatch)
    advice = tmp_path / "slurm" / "gpu-cost-advice.tsv"
    name = _policy(tmp_path, monkeypatch, forecast={"enabled": False}, verifier={"enabled": False},
                   rightsize={"advice_file": str(advice)})
    # alice's jobs finished before both instants; bob's only the newer nightly sees finish
    history(store, 6, start=OLDER.timestamp() - 9 * 86400.0)
    still_running(store, at=OLDER.timestamp() - 3600.0)
    history(store, 6, first=6, user="bob", needs=[2] * 12, start=OLDER.timestamp() + 3600.0)
    still_running(store, at=NEWER.timestamp() - 3600.0)
    dag = dagbag.dags["gpu_forecast_nightly"]

    def nightly(when: pendulum.DateTime) -> dict[str, Any]:
        dr = dag.test(run_conf={"policy": name, "source": "sim"}, logical_date=when)
        tis = {ti.task_id: ti for ti in dr.get_task_instances()}
        assert dr.state == "success", {t: ti.state for t, ti in tis.items()}
        return dict(tis["rightsize"].xcom_pull(task_ids="rightsize"))

    newer = nightly(NEWER)
    text = advice.read_text(encoding="utf-8")
    assert newer["file"] == str(advice) and "\tbob\t" in text and "\talice\t" in text
    at = rightsize.file_instant(advice)
    assert at is not None and pendulum.parse(newer["at"]).timestamp() == at

    older = nightly(OLDER)
    assert pendulum.parse(older["at"]).timestamp() < at
    assert advice.read_text(encoding="utf-8") == text  # the older run did not replace the newer advice
    assert older["file"] is None and older["kept"] == {"file": str(advice), "at": newer["at"]}


def _escalations(store: AuditStore) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["rule"], r["target"], r["track"]): r for r in store.query("SELECT * FROM gpu_cost_escalations")}


def test_an_older_sweep_leaves_the_newer_ladders(airflow_db, dagbag, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = _own_store(tmp_path, monkeypatch)
    # the default cluster pinned at the newer instant: 2.5 h earlier carol's job 1003 was still busy and
    # bob's job 1002 still running (no zombie yet), so the older sweep does not see what the newer one saw
    text = (ROOT / "include" / "scenarios" / "default.yaml").read_text()
    (tmp_path / "scenario.yaml").write_text(text.replace("seed: 7", f"seed: 7\nanchor: {NEWER.isoformat()}", 1))
    monkeypatch.setenv("GPU_COST_SCENARIO", str(tmp_path / "scenario.yaml"))
    dag = dagbag.dags["gpu_zombie_sweep"]

    def sweep(when: pendulum.DateTime) -> None:
        dr = dag.test(run_conf={"policy": "default", "source": "sim"}, logical_date=when)
        assert dr.state == "success", {ti.task_id: ti.state for ti in dr.get_task_instances()}

    sweep(NEWER)
    after_newer = _escalations(store)
    ladders = {k: (r["episode"], r["rung"], r["state"]) for k, r in after_newer.items()}
    assert ladders[("idle_allocation", "job:1003", "dry-run")] == (1, 0, "open"), ladders
    assert any(rule == "zombie" for rule, _t, _k in ladders), ladders

    sweep(NEWER.subtract(minutes=150))
    after_older = _escalations(store)
    assert {k: after_older[k] for k in after_newer} == after_newer  # not closed, not seen earlier, not reopened
