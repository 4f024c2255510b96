"""Benchmark: how long each DAG file takes to parse the way Airflow's DAG processor parses it.

The DAG processor parses a file in a fresh process that already has Airflow imported. So each
measurement here is one fresh process: import Airflow (not timed), then time ``DagBag`` on the
one file, counting SQL statements sent by any engine and connection/variable lookups during the
parse. The median over repeated fresh processes is reported.

    python -m bench.parse [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench._common import in_fresh_process, report

ROOT = Path(__file__).resolve().parents[1]


def one(path: str) -> dict[str, object]:
    import sqlalchemy
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import BaseHook, Variable

    counts = {"sql": 0, "lookups": 0}

    @sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, "before_cursor_execute")
    def _count(*_a, **_k):  # type: ignore[no-untyped-def]
        counts["sql"] += 1

    real_conn = BaseHook.get_connection.__func__  # type: ignore[attr-defined]
    real_var = Variable.get

    def conn(cls, *a, **k):  # type: ignore[no-untyped-def]
        counts["lookups"] += 1
        return real_conn(cls, *a, **k)

    def var(*a, **k):  # type: ignore[no-untyped-def]
        counts["lookups"] += 1
        return real_var(*a, **k)

    BaseHook.get_connection = classmethod(conn)  # type: ignore[method-assign,assignment]
    Variable.get = staticmethod(var)  # type: ignore[method-assign,assignment]
    before = set(sys.modules)
    t0 = time.perf_counter()
    bag = DagBag(dag_folder=path)
    dt = time.perf_counter() - t0
    heavy = sorted(m for m in ("pandas", "numpy", "prophet", "matplotlib", "sqlalchemy.orm", "paramiko",
                               "prometheus_api_client") if m in sys.modules and m not in before)
    return {"seconds": dt, "sql": counts["sql"], "lookups": counts["lookups"], "errors": len(bag.import_errors),
            "dags": len(bag.dags), "imported_heavy": heavy}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one)))
        return
    rows = []
    for f in sorted((ROOT / "dags").glob("*.py")):
        runs = [in_fresh_process("bench.parse", ["--one", str(f)]) for _ in range(args.repeat)]
        rows.append({
            "dag_file": f.name, "median_s": statistics.median(r["seconds"] for r in runs),
            "max_s": max(r["seconds"] for r in runs), "sql": max(r["sql"] for r in runs),
            "lookups": max(r["lookups"] for r in runs), "errors": max(r["errors"] for r in runs),
            "heavy_imports": ",".join(runs[0]["imported_heavy"]) or "-",
        })
    report("parse", rows, ["dag_file", "median_s", "max_s", "sql", "lookups", "errors", "heavy_imports"])


if __name__ == "__main__":
    main(sys.argv[1:])
