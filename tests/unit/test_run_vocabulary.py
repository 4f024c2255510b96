"""One vocabulary for a run's mode and another for its status, each defined once and held on write.

A mode is the policy's (dry-run, notify, enforce: what a run was allowed to do); a status is what
happened to a run (ok, failed, refused, ...). A manual reclaim refused before it started used to
write ``mode=refused``, and the weekly report's banner then read "modes this week: dry-run,
notify, refused". The store refuses a value outside its vocabulary, a refused run records the
mode of the policy it had loaded (none when none could be loaded), and the report lists modes only.
"""

from __future__ import annotations

import json
import re
import types
import uuid
from pathlib import Path

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.core.errors import AuditError
from gpu_cost.core.model import MODES, RUN_STATUSES
from tests.fixtures.core import NOW

HOUR = 3600.0


def test_the_store_refuses_a_run_mode_outside_the_policys_modes(store: AuditStore) -> None:
    with pytest.raises(AuditError, match=r"insert_run: mode 'refused' is not one of dry-run, notify, enforce"):
        store.begin_run("r:1", dag_id="d", started_at=NOW, data_ts=NOW, source="sim", mode="refused")
    # the same write by its statement name (the sweep's finish writes it so) is held by the same check
    with pytest.raises(AuditError, match=r"mode 'live' is not one of dry-run, notify, enforce"):
        store.execute("insert_run", {"run_id": "r:2", "dag_id": "d", "started_at": NOW, "data_ts": NOW,
                                     "source": "sim", "mode": "live"})
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_run_log")[0]["n"] == 0
    for mode in MODES:
        store.begin_run(f"r:{mode}", dag_id="d", started_at=NOW, data_ts=NOW, source="sim", mode=mode)
    # no policy could be loaded: no mode, said as nothing rather than as a word that is not a mode
    store.execute("insert_run", {"run_id": "r:none", "dag_id": "d", "started_at": NOW, "data_ts": None,
                                 "source": None, "mode": None})
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_run_log")[0]["n"] == len(MODES) + 1


def test_the_store_refuses_a_run_status_or_a_decision_mode_outside_its_vocabulary(store: AuditStore) -> None:
    store.begin_run("r:1", dag_id="d", started_at=NOW, data_ts=NOW, source="sim", mode="dry-run")
    with pytest.raises(AuditError, match=r"finish_run: status 'dry-run' is not one of .*\bok\b.*\brefused\b"):
        store.finish_run("r:1", status="dry-run", finished_at=NOW)
    assert store.get_run("r:1")["status"] == "running"  # type: ignore[index]
    for status in RUN_STATUSES:
        if status != "running":  # the view's word for a run with no event yet, never written
            store.finish_run("r:1", status=status, finished_at=NOW)
    row = {"decision_id": "d1", "run_id": "r:1", "ts": NOW, "rule": "idle_allocation", "target_kind": "job",
           "target": "job:1", "action": "cancel", "mode": "refused", "rung": 0, "episode": 1, "job_id": "1",
           "user_name": "bob", "account": "a", "partition_name": "p", "host": "n1", "gpus": 1, "reason": "r",
           "protection": None, "requires_approval": 0, "approval_status": None, "status": "decided",
           "gpu_hours_at_risk": 0.0, "gpu_hours_saved": 0.0, "evidence": "{}"}
    with pytest.raises(AuditError, match=r"insert_decision: mode 'refused' is not one of dry-run, notify, enforce"):
        store.execute("insert_decision", [row])
    assert store.get_decision("d1") is None


# -- a refused manual reclaim: its run row says the policy's mode and the status refused ------------
@pytest.fixture
def policy_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "live.yaml").write_text("mode: notify\nmanual: {operators: [ops]}\n")
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(folder))
    return folder


def _prepare(params: dict[str, object]) -> dict[str, object]:
    """Run ``gpu_manual_reclaim``'s prepare on ``params`` (a refused request); return its run row."""
    from gpu_cost.airflow import reclaim_tasks, runtime
    from gpu_cost.loop.reclaim import ReclaimRequestError

    run = f"manual__{uuid.uuid4().hex[:8]}"
    context = {"dag_run": types.SimpleNamespace(dag_id=reclaim_tasks.DAG_ID, run_id=run, run_after=None,
                                                triggering_user_name="ops"),
               "data_interval_end": NOW, "logical_date": NOW}
    with pytest.raises(ReclaimRequestError, match="refused"):
        reclaim_tasks.prepare(params, context)
    row = runtime.store().get_run(f"{reclaim_tasks.DAG_ID}:{run}")
    assert row is not None
    return row


BAD_REQUEST = {"target_kind": "job", "target_ids": ["7"], "action": "explode", "reason": "freeing idle GPUs now",
               "dry_run": False, "source": "sim"}


def test_a_refused_manual_reclaim_records_the_policys_mode(policy_dir: Path) -> None:
    row = _prepare({**BAD_REQUEST, "policy": "live"})
    assert row["status"] == "refused" and row["mode"] == "notify"
    assert "action: 'explode' is not one of" in json.loads(row["problems"])[0]


def test_a_manual_reclaim_refused_before_its_policy_loaded_records_no_mode(policy_dir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_COST_SOURCE", raising=False)
    row = _prepare({**BAD_REQUEST, "policy": "nope"})
    assert row["status"] == "refused" and row["mode"] is None and row["source"] == "sim"  # the source it named
    assert "not a policy of the deployment's policy directory" in json.loads(row["problems"])[0]
    # "as configured" is the policy's sweep.source: with no policy there is no source to record, not the word
    row = _prepare({**BAD_REQUEST, "policy": "nope", "source": "configured"})
    assert row["status"] == "refused" and row["mode"] is None and row["source"] is None


# -- the report: modes only, in the vocabulary's order ------------------------------------------------
def test_the_reports_banner_lists_modes_only(store: AuditStore, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.report import kpis
    from gpu_cost.report.charts import render_all
    from gpu_cost.report.render import render_html

    for i, (mode, status) in enumerate([("notify", "ok"), ("dry-run", "ok"), (None, "refused"),
                                        ("notify", "refused")]):
        store.execute("insert_run", {"run_id": f"r:{i}", "dag_id": "d", "started_at": NOW - HOUR,
                                     "data_ts": NOW - HOUR, "source": "sim", "mode": mode})
        store.finish_run(f"r:{i}", status=status, finished_at=NOW)
    # a row an older agent wrote, before the store held the vocabulary: still not a mode
    with store.engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO gpu_cost_run_log (run_id, dag_id, started_at, data_ts, source, mode) "
                             "VALUES ('r:old', 'd', '2026-11-29T13:00:00Z', '2026-11-29T13:00:00Z', 'sim', 'refused')")
    k = kpis.compute(store, policy, NOW - 7 * 86400, NOW)
    assert k["data"]["modes"] == ["dry-run", "notify"]
    html = render_html(k, render_all(k))
    banner = html.split('id="provenance"')[1].split("</section>")[0]
    assert re.search(r"modes [^:<]*: dry-run, notify\.", banner) and "refused" not in banner


def test_the_policys_modes_are_one_list() -> None:
    from typing import get_args

    from gpu_cost.config.schema import Mode, milder

    assert get_args(Mode) == MODES
    assert milder("enforce", "notify") == "notify" and milder("dry-run", "enforce") == "dry-run"
