"""Benchmark: how long each DAG file takes to parse the way Airflow's DAG processor parses it.

Airflow 3's DAG processor parses a file in a process forked (``os.fork``) from one that already
has Airflow imported. So each measurement here is one such process: this bench imports what the
parse needs from Airflow once (not timed), forks, and the child times ``DagBag`` on the one file,
counting SQL statements sent by any engine and connection/variable lookups during the parse, and
the modules the parse imported. The median over repeated forks is reported.

Two reference rows give the floor: ``(trivial DAG)``, a two-task TaskFlow DAG that imports
nothing but ``airflow.sdk``, parsed the same way; and ``(import airflow.sdk)``, what importing the
Task SDK costs a fresh interpreter (the DAG processor pays it once, not per file).

    python -m bench.parse [--repeat 5]
    python -m bench.parse --live [--parses 10]

``--live`` measures what a running Airflow reports instead: a real ``airflow dag-processor`` (its own
``AIRFLOW_HOME``, SQLite, the repository's DAG files and the trivial DAG in its folder) re-parses
every file every few seconds, and each parse's duration is read where the processor writes it, the
``dag`` table's ``last_parse_duration`` (the "Last Duration" of its stats table and the UI). The
median and the maximum over ``--parses`` parses per file are reported, twice, on a copy of the
DAG files and of the package in a temporary home: with Python's bytecode cache (its default: the
DAG files and the package's modules are compiled once, then read from ``.pyc``) and without it
(``PYTHONDONTWRITEBYTECODE=1`` and no ``.pyc`` of the project's: every parse compiles the DAG file
and the package modules it imports again; Airflow's own modules keep the ``.pyc`` pip wrote).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench._common import in_fresh_process, report

ROOT = Path(__file__).resolve().parents[1]
#: modules that must not be imported while a DAG file is parsed
HEAVY = ("pandas", "numpy", "prophet", "matplotlib", "sqlalchemy.orm", "paramiko", "gpu_cost.perceive.prometheus",
         "gpu_cost.loop.sweep", "gpu_cost.audit.store", "gpu_cost.perceive.snapshot", "gpu_cost.capacity.forecast.nightly")
TRIVIAL_DAG = '''
import pendulum
from airflow.sdk import dag, task


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def trivial():
    @task
    def a() -> int:
        return 1

    @task
    def b(x: int) -> int:
        return x

    b(a())


trivial()
'''


def import_cost() -> dict[str, object]:
    t0 = time.perf_counter()
    import airflow.sdk  # noqa: F401

    return {"seconds": time.perf_counter() - t0, "sql": 0, "lookups": 0, "errors": 0, "dags": 0, "imported_heavy": []}


def _parser_imports() -> None:
    """Import what the DAG processor has imported before it forks a parser (and :func:`one` uses)."""
    import sqlalchemy  # noqa: F401
    from airflow.dag_processing.dagbag import DagBag  # noqa: F401
    from airflow.sdk import BaseHook, Variable  # noqa: F401


def forked(path: str) -> dict[str, Any]:
    """Run :func:`one` on ``path`` in a child forked from this process; return its row."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: parse, send the row (or what went wrong), leave without the parent's exit handlers
        code = 0
        try:
            os.close(read)
            quiet = os.open(os.devnull, os.O_WRONLY)  # Airflow logs the parse: not this bench's output
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            try:
                text = json.dumps(one(path))
            except BaseException:
                code, text = 1, traceback.format_exc()
            with os.fdopen(write, "w") as out:
                out.write(text)
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as inp:
        text = inp.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"parsing {path} in a forked process failed:\n{text[-3000:]}")
    row: dict[str, Any] = json.loads(text)
    return row


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
    heavy = sorted(m for m in HEAVY if m in sys.modules and m not in before)
    return {"seconds": dt, "sql": counts["sql"], "lookups": counts["lookups"], "errors": len(bag.import_errors),
            "dags": len(bag.dags), "imported_heavy": heavy}


def live(parses: int = 10, bytecode: bool = True, interval: int = 3, timeout: float = 900.0) -> list[dict[str, object]]:
    """Run a real dag-processor over the DAG files until each is parsed ``parses`` times; return a row per file.

    ``bytecode``: let Python cache compiled modules (beside the copies in the temporary home), else
    compile the project's modules on every parse. The processor run is :func:`bench.dag_parse.processor_parses`.
    """
    from bench.dag_parse import processor_parses

    seen, pyc = processor_parses(parses, bytecode=bytecode, interval=interval, timeout=timeout)
    return [{"dag_file": f, "bytecode": "cached" if bytecode else "none", "project_pyc": pyc, "parses": len(d),
             "median_s": statistics.median(d), "max_s": max(d), "median_under_0_1s": statistics.median(d) < 0.1,
             "max_under_0_3s": max(d) < 0.3} for f, d in seen.items()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--live", action="store_true", help="measure with a running dag-processor (its Last Duration)")
    ap.add_argument("--parses", type=int, default=10, help="with --live: parses per file")
    ap.add_argument("--import-cost", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.import_cost:
        print(json.dumps(import_cost()))
        return
    if args.live:
        rows = live(args.parses, bytecode=True) + live(args.parses, bytecode=False)
        report("parse-live", rows, ["dag_file", "bytecode", "project_pyc", "parses", "median_s", "max_s", "median_under_0_1s",
                                    "max_under_0_3s"])
        return
    trivial = Path(tempfile.mkdtemp(prefix="gpu-cost-bench-parse-")) / "trivial_dag.py"
    trivial.write_text(TRIVIAL_DAG)
    cases = [(f.name, str(f)) for f in sorted((ROOT / "dags").glob("*.py"))] + [("(trivial DAG)", str(trivial))]
    # what importing the Task SDK costs a fresh interpreter: before this process imports Airflow
    sdk = [in_fresh_process("bench.parse", ["--import-cost"]) for _ in range(args.repeat)]
    _parser_imports()
    # no parse can be seen importing what Airflow's DagBag itself imported (sqlalchemy.orm); the
    # package's own modules and the data libraries must stay visible
    preloaded = [m for m in HEAVY if m in sys.modules]
    if blind := [m for m in preloaded if m.startswith(("gpu_cost", "pandas", "numpy"))]:
        raise SystemExit(f"bench.parse: {', '.join(blind)} imported before the parses fork")
    print(f"imported with Airflow before every parse (never counted): {', '.join(preloaded) or '-'}")
    gc.freeze()  # as the DAG processor's manager does before it forks: children leave those objects alone
    rows = []
    for name, case in [*cases, ("(import airflow.sdk)", "")]:
        runs = [forked(case) for _ in range(args.repeat)] if case else sdk
        rows.append({
            "dag_file": name, "median_s": statistics.median(r["seconds"] for r in runs),
            "max_s": max(r["seconds"] for r in runs), "sql": max(r["sql"] for r in runs),
            "lookups": max(r["lookups"] for r in runs), "errors": max(r["errors"] for r in runs),
            "heavy_imports": ",".join(runs[0]["imported_heavy"]) or "-",
            "under_0_2s": statistics.median(r["seconds"] for r in runs) < 0.2 if name.endswith(".py") else None,
        })
    trivial.unlink()
    trivial.parent.rmdir()
    report("parse", rows, ["dag_file", "median_s", "max_s", "sql", "lookups", "errors", "heavy_imports", "under_0_2s"])


if __name__ == "__main__":
    main(sys.argv[1:])
