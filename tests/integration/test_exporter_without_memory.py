"""An exporter configured without the framebuffer metrics, scraped by the real Prometheus: the sweep says so.

The world: the session's real Slurm 22.05 (no job running) and real Prometheus 2.42, scraping every 5 s a
dcgm-format exporter (:mod:`tests.fixtures.hostile_exporter`) that serves utilisation, power and temperature for
two GPUs of Slurm's node ``gpu01`` but no ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (a counters file that
leaves them out). ``gpu-cost sweep --source prometheus --json`` runs as an operator runs it.

Expected: the GPUs are read (fresh, not stale), their framebuffer is not measured (NaN, never 0), and the run's
problems say what that costs; the run is not degraded for it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time

import pytest

from tests.fixtures.hostile_exporter import STEP, WINDOW, HostileExporter, policy
from tests.fixtures.prometheus import PromLab, gpu_cost_bin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = "gpu-nomem"
SELECTOR = f'job="{JOB}"'
POLICY = policy("dry-run", "  idle_allocation: {window: 60s, min_runtime: 60s}\n")


def test_a_sweep_over_an_exporter_without_the_framebuffer_says_what_it_cannot_see(  # type: ignore[no-untyped-def]
        slurm_cluster, prom_lab: PromLab, tmp_path) -> None:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.perceive import live
    from gpu_cost.perceive.prometheus import PrometheusSource
    from gpu_cost.perceive.slurm import SlurmSource
    from gpu_cost.perceive.snapshot import MEMORY_NOT_MEASURED

    (tmp_path / "policy.yaml").write_text(POLICY)
    policy = load_policy(tmp_path / "policy.yaml")
    slurm_cluster.cancel_all()
    node = slurm_cluster.nodes[0]
    exporter = HostileExporter(without=frozenset({"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"})).start()
    try:
        exporter.set(node, 0, util=0.0)
        exporter.set(node, 1, util=85.0, power=300.0)
        assert "DCGM_FI_DEV_FB_USED" not in exporter.exposition()
        started = time.time()
        prom_lab.add_target(JOB, exporter.port)
        prom_lab.wait_up(1, timeout=30, job=JOB)
        time.sleep(max(0.0, started + WINDOW + 2 * STEP - time.time()))  # a window of samples
        at = math.floor(time.time() / STEP) * STEP
        env = {**os.environ, **slurm_cluster.env, "AIRFLOW_CONN_GPU_COST_PROMETHEUS": prom_lab.conn_env(SELECTOR),
               "AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")})}
        for var in ("AIRFLOW_CONN_GPU_COST_NODE_SSH", "AIRFLOW_CONN_GPU_COST_SLACK"):
            env.pop(var, None)
        res = subprocess.run([gpu_cost_bin(), "sweep", "--source", "prometheus", "--policy", str(tmp_path / "policy.yaml"),
                              "--at", str(int(at)), "--json"], capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout)
        said = [p for p in out["problems"] if p.startswith("no GPU reports framebuffer memory used")]
        assert len(said) == 1 and MEMORY_NOT_MEASURED in said[0], out["problems"]
        assert out["gpus"] == 2 and not out["degraded"], out["problems"]
        snap = live.snapshot(policy, at, prometheus=PrometheusSource(prom_lab.config(SELECTOR)),
                             slurm=SlurmSource(slurm_cluster.runner), processes=False)
        g = snap.gpus
        assert len(g) == 2 and not g["stale"].any(), g[["host", "gpu", "stale", "n_samples"]]
        assert g["mem_max_mib"].isna().all() and g["mem_min_mib"].isna().all()  # not measured: never read as 0
        assert g["util_max"].max() >= 80  # the rest of the exporter is read
    finally:
        (prom_lab.root / f"extra-{JOB}.json").unlink(missing_ok=True)
        exporter.stop()
