"""Benchmark: what an approval step costs a DAG run when no decision of the run needs a human.

Real ``dag.test()`` runs of ``gpu_offhours_power`` and ``gpu_zombie_sweep`` in dry-run on a small
simulated cluster (their decisions are recorded, none needs approval), in a fresh Airflow home with a migrated SQLite
metadata DB and its own audit store (not timed). It prints each task's duration as Airflow
recorded it (``end_date - start_date`` of the task instance), the state of ``approve`` and what
the step adds to the run (from the end of ``plan``, its upstream, to its own end: scheduling
included): the step should cost well under a second when nobody is asked. Target: < 1 s.

    python -m bench.approval_skip [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import in_fresh_process, report

ROOT = Path(__file__).resolve().parents[1]
#: DAG -> the task upstream of its ``approve`` step
DAGS = {"gpu_offhours_power": "plan", "gpu_zombie_sweep": "route"}
TARGET_S = 1.0
SCENARIO = """
seed: 3
anchor: now
nodes:
  - {name: n01, gpus: 4, model: a100, idle_power_w: 60}
  - {name: n02, gpus: 4, model: a100, idle_power_w: 70}
  - {name: n03, gpus: 4, model: h100, idle_power_w: 90}
jobs:
  - {job_id: "2001", user: alice, account: nlp, name: train, behaviour: dataloader, node: n01, gpus: [0], start: -3h}
"""


def one(dag_id: str) -> dict[str, Any]:
    """Run ``dag_id`` once in this (fresh) process, in a temporary Airflow home (removed after); return each task's
    duration and state."""
    with tempfile.TemporaryDirectory(prefix="gpu-cost-bench-approval-") as tmp:
        return _one(dag_id, Path(tmp))


def _one(dag_id: str, home: Path) -> dict[str, Any]:
    os.environ.update({
        "AIRFLOW_HOME": str(home / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(home / "audit.db")}),
        "GPU_COST_HOME": str(home / "gpu_cost"), "GPU_COST_APPROVAL_NOTIFY": "0",
        "GPU_COST_POLICY_DIR": str(home), "GPU_COST_SCENARIO": str(home / "scenario.yaml"),
    })
    (home / "airflow").mkdir()
    (home / "scenario.yaml").write_text(SCENARIO)
    (home / "bench.yaml").write_text("offhours: {warm_reserve_nodes: 1, util_max: 50}\n")
    import pendulum
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db

    db.resetdb()
    dag = DagBag(dag_folder=str(ROOT / "dags" / f"{dag_id}.py")).dags[dag_id]
    night = pendulum.datetime(2026, 11, 24, 23, 0, tz="UTC")
    dr = dag.test(run_conf={"policy": "bench", "source": "sim"}, logical_date=night)
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    tasks = {k: {"state": str(ti.state), "seconds": (ti.end_date - ti.start_date).total_seconds()
                 if ti.start_date and ti.end_date else 0.0} for k, ti in tis.items()}
    # what the step adds to the run: from its upstream's end to its own end, scheduling included
    plan, approve = tis[DAGS[dag_id]], tis["approve"]
    added = (approve.end_date - plan.end_date).total_seconds() if approve.end_date and plan.end_date else None
    ends = [ti.end_date for ti in tis.values() if ti.end_date]
    starts = [ti.start_date for ti in tis.values() if ti.start_date]
    run_s = (max(ends) - min(starts)).total_seconds() if ends and starts else None
    return {"run_state": str(dr.state), "run_s": run_s, "approve_added_s": added, "tasks": tasks}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dags", default=",".join(DAGS), help="DAG ids, comma-separated")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one)))
        return
    rows = [_row(d, [in_fresh_process("bench.approval_skip", ["--one", d]) for _ in range(args.repeat)])
            for d in args.dags.split(",")]
    report("approval_skip", rows, ["dag", "runs", "approve_state", "approve_median_s", "approve_max_s",
                                   "approve_added_median_s", "upstream_median_s", "run_median_s", "target",
                                   "meets_target", "load_avg_1m"])


def _row(dag_id: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    approve = [r["tasks"]["approve"]["seconds"] for r in runs]
    added = [r["approve_added_s"] or 0.0 for r in runs]
    return {
        "dag": dag_id, "runs": len(runs), "approve_state": runs[0]["tasks"]["approve"]["state"],
        "approve_median_s": statistics.median(approve), "approve_max_s": max(approve),
        "approve_added_median_s": statistics.median(added),
        "upstream_median_s": statistics.median(r["tasks"][DAGS[dag_id]]["seconds"] for r in runs),
        "run_median_s": statistics.median(r["run_s"] or 0.0 for r in runs),
        "target": f"<{TARGET_S:g}s", "meets_target": statistics.median(added) < TARGET_S,
        "load_avg_1m": os.getloadavg()[0],
    }


if __name__ == "__main__":
    main(sys.argv[1:])
