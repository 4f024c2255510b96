"""Benchmark: each DAG file's parse time as a running dag-processor reports it (mean and max per file).

A real ``airflow dag-processor`` (its own ``AIRFLOW_HOME``, SQLite, two parsing processes, as a
deployment runs it) parses copies of the shipped DAG files and of the package, with a trivial
two-task DAG beside them for the floor, and re-parses every file every ``--interval`` seconds.
Each parse's duration is read where the processor writes it: the ``dag`` table's
``last_parse_duration``, the same figure as the "Last Duration" of its "DAG File Processing
Stats" table, the UI's and the ``dag_processing.last_duration`` metric's. It is the processor's
wall time for the file (forking the parser, importing the file, serializing the DAG), so other
work on the machine adds to it: the figures are printed with the machine's cores and its load
average over the measurement, and the date.

    python -m bench.dag_parse [--parses 10] [--interval 3] [--no-bytecode]

``--no-bytecode``: no ``.pyc`` of the project's (``PYTHONDONTWRITEBYTECODE=1``), every parse
compiles the DAG file and the package modules it imports again, as on a deployment whose DAG
folder and package cannot be written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import report

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL = "(trivial DAG)"


def processor_parses(parses: int = 10, bytecode: bool = True, interval: int = 3,
                     timeout: float = 900.0) -> tuple[dict[str, list[float]], int]:
    """Run a real dag-processor over the DAG files until each is parsed ``parses`` times.

    Returns each file's parse durations (the trivial DAG under :data:`TRIVIAL`) and how many
    ``.pyc`` of the project's the run left (0 without bytecode).
    """
    from bench.parse import TRIVIAL_DAG

    home = Path(tempfile.mkdtemp(prefix="gpu-cost-bench-dag-parse-"))
    dags = home / "dags"
    dags.mkdir()
    plugins = home / "plugins"  # a copy with no .pyc, ahead of the installed package on sys.path
    shutil.copytree(ROOT / "plugins", plugins, ignore=shutil.ignore_patterns("__pycache__"))
    for f in sorted((ROOT / "dags").glob("*.py")):
        shutil.copy(f, dags / f.name)
    (dags / "trivial_dag.py").write_text(TRIVIAL_DAG)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX"))}
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update({
        "PYTHONPATH": os.pathsep.join([str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "GPU_COST_INCLUDE": str(ROOT / "include"),
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(interval),
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "2",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "GPU_COST_HOME": str(home / "gpu_cost"), "GPU_COST_SOURCE": "sim",
    })
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, check=True, timeout=300)
    log = (home / "dag-processor.log").open("wb")
    proc = subprocess.Popen([airflow, "dag-processor"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    seen: dict[str, dict[str, float]] = {}  # file -> {parsed at: duration}
    files = {f.name for f in dags.glob("*.py")}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"dag-processor exited {proc.returncode}: "
                                   f"{(home / 'dag-processor.log').read_text()[-2000:]}")
            try:
                with sqlite3.connect(home / "airflow.db", timeout=5) as db:
                    rows = db.execute("SELECT fileloc, last_parsed_time, last_parse_duration FROM dag "
                                      "WHERE last_parse_duration IS NOT NULL").fetchall()
            except sqlite3.OperationalError:
                rows = []
            for fileloc, at, duration in rows:
                seen.setdefault(Path(fileloc).name, {})[str(at)] = float(duration)
            if all(len(seen.get(f, {})) >= parses for f in files):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"not every file was parsed {parses} times in {timeout:.0f} s: "
                               f"{ {f: len(seen.get(f, {})) for f in sorted(files)} }")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        pyc = len(list(home.glob("plugins/**/*.pyc"))) + len(list(dags.glob("**/*.pyc")))
        shutil.rmtree(home, ignore_errors=True)
    out = {(TRIVIAL if f == "trivial_dag.py" else f): list(seen[f].values())
           for f in sorted(files, key=lambda x: (x == "trivial_dag.py", x))}
    return out, pyc


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--parses", type=int, default=10, help="parses per file")
    ap.add_argument("--interval", type=int, default=3, help="seconds between two parses of a file")
    ap.add_argument("--no-bytecode", action="store_true", help="compile the project's modules at every parse")
    args = ap.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    load_before = os.getloadavg()[0]
    durations, _pyc = processor_parses(args.parses, bytecode=not args.no_bytecode, interval=args.interval)
    load_after = os.getloadavg()
    machine = {"date": started.strftime("%Y-%m-%d"), "cores": os.cpu_count(),
               # the 1-minute load average at the start and the end, and the 5-minute one at the end
               "load_1m": f"{load_before:.1f}-{load_after[0]:.1f}", "load_5m": f"{load_after[1]:.1f}",
               "bytecode": "none" if args.no_bytecode else "cached",
               "command": " ".join(["python -m bench.dag_parse", *(argv or [])])}
    rows = [{"dag_file": f, "parses": len(d), "mean_s": statistics.fmean(d), "median_s": statistics.median(d),
             "max_s": max(d), **machine} for f, d in durations.items()]
    report("dag-parse", rows, ["dag_file", "parses", "mean_s", "median_s", "max_s", "date", "cores", "load_1m",
                               "load_5m", "bytecode"])


if __name__ == "__main__":
    main(sys.argv[1:])
