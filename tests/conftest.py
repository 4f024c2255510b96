"""Test session set-up: an isolated Airflow home and audit store, before anything imports Airflow.

Fixture modules in ``tests/fixtures/`` are loaded as plugins, one file per service (Airflow DB,
PostgreSQL, Slurm, Prometheus, sshd, ...). Services are started once per session on loopback
ports chosen at run time, and stopped at the end.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="gpu-cost-tests-"))
_SESSION_DIR.chmod(0o755)  # services running as their own users (postgres, munge) must reach it
os.environ["GPU_COST_TEST_TMP"] = str(_SESSION_DIR)
if not os.environ.get("GPU_COST_KEEP_TEST_TMP"):  # set it to read a failed session's logs and stores after it
    # after the session fixtures have stopped their services; a service's own user's files may stay
    atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = str(_SESSION_DIR / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__EXECUTOR"] = "LocalExecutor"
os.environ["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "True"
os.environ.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
os.environ["GPU_COST_HOME"] = str(_SESSION_DIR / "gpu_cost")
os.environ["AIRFLOW_CONN_GPU_COST_DB"] = json.dumps({"conn_type": "sqlite", "host": str(_SESSION_DIR / "audit.db")})
for var in ("GPU_COST_POLICY", "GPU_COST_SOURCE", "GPU_COST_SCENARIO"):
    os.environ.pop(var, None)
(_SESSION_DIR / "airflow").mkdir(parents=True, exist_ok=True)

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}" for p in (ROOT / "tests" / "fixtures").glob("*.py") if not p.name.startswith("_")
)
