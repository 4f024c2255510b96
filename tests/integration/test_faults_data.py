"""Missing or bad data ⇒ no destructive action: faults injected into the real sources of a sweep.

The world: the session's real Slurm 22.05 runs an idle job on ``gpu01`` and a busy one on
``gpu02``; two ``gpu-cost sim serve --slurm`` exporters (one per node) turn them into DCGM series
that the session's real Prometheus scrapes every 5 s. The policy is in **enforce** mode with a
one-rung ``demote`` ladder, no approval and no caps worth the name, so on whole data the sweep
decides a real, destructive demote of the idle job (the baseline proves it). Then each fault is
injected into the real path — ``gpu_cost.loop.sweep.run_once(source="prometheus")`` — and every time:
the run is recorded ``degraded`` in ``gpu_cost_runs``, no decision of the run would act
destructively, and the ops alert (rule ``agent_health``, posted to the Slack sink) is raised once
for the episode, not once per run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.prometheus import PromLab

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POLICY = """
version: 1
mode: enforce
sweep: {source: prometheus, sample_interval: 5s, lookback: 5m, min_sample_ratio: 0.5, max_staleness: 30s}
rules:
  zombie: {window: 60s}
  idle_allocation: {window: 60s, min_runtime: 60s, ladder: [{action: demote}]}
  idle_interactive: {window: 60s, min_runtime: 60s}
  low_efficiency: {min_runtime: 60s}
protections: []
approval: {gpu_hours_at_risk: 100000}
caps: {max_actions_per_run: 50, max_gpu_share: 1.0}
notifications: {slack_channel: "#gpu-ops"}
"""
EXPORTERS = {"faults-a": "gpu01", "faults-b": "gpu02"}
BOTH = 'job=~"faults-a|faults-b"'


class World:
    def __init__(self, slurm: Any, lab: PromLab, policy: Any, idle_job: str, busy_job: str, root: Path) -> None:
        self.slurm, self.lab, self.policy, self.idle_job, self.busy_job, self.root = slurm, lab, policy, idle_job, busy_job, root

    def prometheus(self, selector: str = BOTH, **kw: Any) -> Any:
        import dataclasses

        from gpu_cost.perceive.prometheus import PrometheusSource

        kw.setdefault("timeout", 5)
        # no node metrics: the session's node exporter is this machine, not gpu01 or gpu02, and on a loaded
        # machine its busy CPU is rightly read as the idle job working (a data-loading phase), which no
        # fault here is about
        kw.setdefault("node_selector", 'job="faults-no-node-metrics"')
        return PrometheusSource(dataclasses.replace(self.lab.config(selector), **kw))

    def slurm_source(self, env: dict[str, str] | None = None) -> Any:
        from gpu_cost.perceive.runner import LocalRunner
        from gpu_cost.perceive.slurm import SlurmSource

        return SlurmSource(LocalRunner(env=env or self.slurm.env), timeout=20)

    def sweep(self, store: Any, *, now: float | None = None, run: str = "r", **sources: Any) -> dict[str, Any]:
        from gpu_cost.loop.sweep import run_once

        sources.setdefault("prometheus", self.prometheus())
        sources.setdefault("slurm", self.slurm_source())
        at = now if now is not None else float(int(time.time() // 5 * 5))
        return run_once(self.policy, at, store, run_id=f"{run}-{time.time_ns()}", source="prometheus",
                        dag_id="gpu_zombie_sweep", processes=False, **sources)


@pytest.fixture(scope="module")
def world(slurm_cluster, prom_lab: PromLab, tmp_path_factory) -> Iterator[World]:  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import parse_policy

    root = tmp_path_factory.mktemp("faults")
    (root / "policy.yaml").write_text(POLICY)
    policy = parse_policy(POLICY, str(root / "policy.yaml"))
    slurm_cluster.cancel_all()
    idle = slurm_cluster.submit("sleep 900\n", "--job-name=faults-idle", "--gres=gpu:1", "--nodelist=gpu01",
                                "--comment=gpu-cost-sim:idle", "--cpus-per-task=1", "--mem=100")
    busy = slurm_cluster.submit("sleep 900\n", "--job-name=faults-busy", "--gres=gpu:1", "--nodelist=gpu02",
                                "--comment=gpu-cost-sim:training", "--cpus-per-task=1", "--mem=100")
    for jid in (idle, busy):
        slurm_cluster.wait_state(jid, "RUNNING", timeout=30)
    running_since = time.time()
    for job, node in EXPORTERS.items():
        port = prom_lab.start_exporter(job, "--slurm", "--nodes", f"{node}:{slurm_cluster.gpus_per_node}",
                                       "--sample-interval", "5s", env=slurm_cluster.env)
        prom_lab.add_target(job, port)
    for job in EXPORTERS:
        prom_lab.wait_up(1, timeout=30, job=job)
    scraped_since = time.time()
    # the idle job past its 60 s min_runtime, and a whole 60 s window scraped since both exporters were up
    # (counted from the first scrape, not from the jobs' start: on a loaded machine the exporters come up
    # late, and a fixed wait from the start left the window under its min_sample_ratio)
    time.sleep(max(0.0, running_since + 66 - time.time(), scraped_since + 65 - time.time()))
    try:
        yield World(slurm_cluster, prom_lab, policy, idle, busy, root)
    finally:
        for job in EXPORTERS:
            if job in prom_lab.procs:
                prom_lab.stop_process(job)
        for jid in (idle, busy):
            slurm_cluster.run("scancel", jid)


@pytest.fixture
def ops(slack_sink, monkeypatch):  # type: ignore[no-untyped-def]
    """The ops channel: the Slack webhook connection points at the local sink."""
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url()}))
    return slack_sink


def destructive(out: dict[str, Any]) -> list[dict[str, Any]]:
    from gpu_cost.core.model import DESTRUCTIVE_ACTIONS

    return [d for d in out["decisions"] if d["action"] in DESTRUCTIVE_ACTIONS and d["mode"] != "dry-run"]


def alerts(store: Any) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM gpu_cost_decisions WHERE rule = 'agent_health' ORDER BY ts")


def assert_degraded_and_harmless(world: World, store: Any, ops: Any, problem: str, **sources: Any) -> list[str]:
    """Two sweeps under the fault: both degraded, nothing destructive, one alert for the episode."""
    outs = [world.sweep(store, **sources) for _ in range(2)]
    for out in outs:
        assert out["degraded"], out
        assert any(problem in p for p in out["problems"]), out["problems"]
        assert store.get_run(out["run_id"])["status"] == "degraded"
        assert destructive(out) == [], destructive(out)
        held = [d for d in out["decisions"] if d["target"] == f"job:{world.idle_job}"]
        assert all(d["mode"] == "dry-run" for d in held), held
    (alert,) = alerts(store)
    assert alert["target"] == "agent:gpu_zombie_sweep" and problem in alert["reason"]
    assert len(ops.requests) == 1 and problem.split(":")[0] in ops.texts()[0]
    return outs[0]["problems"]


# -- the baseline: whole data, the same policy acts ---------------------------------------------------
def test_baseline_on_whole_data_the_policy_demotes_the_idle_job(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    out = world.sweep(store)
    assert not out["degraded"], out["problems"]
    assert store.get_run(out["run_id"])["status"] == "ok"
    acting = destructive(out)
    assert len(acting) == 1, json.dumps(out, default=str)
    (d,) = acting
    assert d["target"] == f"job:{world.idle_job}" and d["action"] == "demote" and d["mode"] == "enforce"
    assert not d["requires_approval"]
    assert alerts(store) == [] and ops.requests == []


# -- Prometheus -------------------------------------------------------------------------------------
def test_prometheus_down(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    down = world.prometheus(url=f"http://127.0.0.1:{closed}")
    assert_degraded_and_harmless(world, store, ops, "prometheus: Prometheus", prometheus=down)


def test_prometheus_hanging_times_out(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        mute = world.prometheus(url=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1)
        t0 = time.monotonic()
        problems = assert_degraded_and_harmless(world, store, ops, "did not answer", prometheus=mute)
        elapsed = time.monotonic() - t0
    assert any("within 1s" in p for p in problems)
    assert elapsed < 90, f"two sweeps against a hanging Prometheus took {elapsed:.0f}s (bounded by the query timeout)"


def test_stale_samples_agent_clock_ahead(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    """The agent's clock runs 2 minutes ahead of Prometheus: every sample looks stale, none idle."""
    assert_degraded_and_harmless(world, store, ops, "every GPU series is stale or missing",
                                 now=float(int(time.time() // 5 * 5)) + 120)


def test_clock_skew_agent_clock_behind(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    """The agent's clock runs an hour behind: Prometheus has no sample yet at that instant."""
    assert_degraded_and_harmless(world, store, ops, "no GPU series", now=float(int(time.time() // 5 * 5)) - 3600)


def test_a_nodes_exporter_missing(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    """gpu02's exporter is not scraped at all: Slurm runs a GPU job there that nobody can see."""
    assert_degraded_and_harmless(world, store, ops, "no GPU series for node(s) running GPU jobs: gpu02",
                                 prometheus=world.prometheus('job="faults-a"'))


# -- Slurm ------------------------------------------------------------------------------------------
def test_squeue_failing_wrong_controller(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    text = world.slurm.conf.read_text()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    wrong = world.root / "wrong-slurm.conf"
    wrong.write_text("\n".join(f"SlurmctldPort={closed}" if line.startswith("SlurmctldPort=") else line
                               for line in text.splitlines()) + "\n")
    wrong.chmod(0o644)
    env = {**world.slurm.env, "SLURM_CONF": str(wrong)}
    assert_degraded_and_harmless(world, store, ops, "slurm: `squeue --json`", slurm=world.slurm_source(env))


def _squeue_wrapper(world: World, name: str, filter_cmd: str) -> dict[str, str]:
    """A ``squeue`` first on PATH that runs the REAL squeue and mangles its answer."""
    real = subprocess.run(["which", "squeue"], capture_output=True, text=True, check=True).stdout.strip()
    d = world.root / name
    d.mkdir(exist_ok=True)
    script = d / "squeue"
    script.write_text(f'#!/bin/sh\n"{real}" "$@" | {filter_cmd}\n')
    script.chmod(0o755)
    return {**world.slurm.env, "PATH": f"{d}{os.pathsep}{world.slurm.env.get('PATH', os.environ['PATH'])}"}


def test_squeue_truncated_json(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    env = _squeue_wrapper(world, "truncating", "head -c 3000")
    assert_degraded_and_harmless(world, store, ops, "printed invalid JSON", slurm=world.slurm_source(env))


def test_squeue_malformed_json(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    """Valid JSON with a broken field: an unbalanced node list."""
    env = _squeue_wrapper(world, "malformed", "sed 's/\"nodes\": \"gpu/\"nodes\": \"gpu[/'")
    assert_degraded_and_harmless(world, store, ops, "unbalanced", slurm=world.slurm_source(env))


# -- episodes ---------------------------------------------------------------------------------------
def test_alert_once_per_episode(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    """ok → degraded (alert) → degraded → ok → degraded (alert): two episodes, two alerts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]

    def down() -> Any:
        return world.prometheus(url=f"http://127.0.0.1:{closed}")

    statuses = []
    for fault in (False, True, True, False, True):
        out = world.sweep(store, **({"prometheus": down()} if fault else {}))
        statuses.append(store.get_run(out["run_id"])["status"])
    assert statuses == ["ok", "degraded", "degraded", "ok", "degraded"]
    assert len(alerts(store)) == 2 and len(ops.requests) == 2
    rows = store.query("SELECT * FROM gpu_cost_actions WHERE target = 'agent:gpu_zombie_sweep'")
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"]


# -- runs last: it stops an exporter for good ------------------------------------------------------
def test_partial_answers_one_exporter_stopped(world: World, store, ops) -> None:  # type: ignore[no-untyped-def]
    world.lab.stop_process("faults-b")
    world.lab.wait_down("faults-b")
    time.sleep(5)  # the sweep's instant (floored to the 5 s grid) after Prometheus marked the series stale
    assert_degraded_and_harmless(world, store, ops, "stale or missing GPU series")
