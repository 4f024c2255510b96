"""Faults in the middle of acting, on the real Slurm cluster, SSH and audit store.

- The worker is killed (``os._exit(137)``, by the worker script wrapping the real executor: nothing
  in the package knows about it) right after the audit ``started`` row, and right after the effect; the retried task finishes the
  action once and the audit row tells what happened (started row, attempt 2, final status).
- ``slurmctld`` restarts in the middle of a sweep: the action taken while it is down fails
  cleanly and within bounds; the job survives the restart and the act after it succeeds once.
- The audit store is unavailable: dispatch refuses before any effect (the job is untouched).
- An SSH target that refuses or hangs: the node action fails within its timeouts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_cost.core.model import Decision, decision_id

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POLICY = "version: 1\nmode: enforce\nprotections: []\n"

WORKER = """
import json, os, sys, time
from gpu_cost.act import dispatch
from gpu_cost.act.base import ActionContext
from gpu_cost.audit.store import AuditStore
from gpu_cost.core.model import Decision
from gpu_cost.config.loader import parse_policy
from gpu_cost.perceive.runner import LocalRunner

a = json.loads(sys.argv[1])
store = AuditStore(a["store"]).ensure_schema()
dispatch.load_executors()
real = dispatch.REGISTRY[a["decision"]["action"]]


def dying(d, ctx):  # the worker dies before the effect (after the started row) or right after it
    if a["fault"] == "after_effect":
        real(d, ctx)
    os._exit(137)


if a["fault"]:
    dying.touches_cluster = real.touches_cluster
    dispatch.REGISTRY[a["decision"]["action"]] = dying
ctx = ActionContext(policy=parse_policy(a["policy"], "policy.yaml"), dry_run=False, now=a["now"], run_id=a["run_id"],
                    slurm=LocalRunner(env=a["env"]), sleep=time.sleep, extra={"grace_s": 5, "store": store})
print(json.dumps(dispatch.execute([Decision(**a["decision"])], ctx, store)))
"""


def _policy() -> Any:
    from gpu_cost.config.loader import parse_policy

    return parse_policy(POLICY, "policy.yaml")


def _decision(job_id: str, action: str, rule: str = "idle_allocation", rung: int = 0) -> Decision:
    target = f"job:{job_id}"
    return Decision(decision_id=decision_id(rule, target, 1, rung), ts=time.time(), rule=rule, target_kind="job",
                    target=target, action=action, mode="enforce", rung=rung, job_id=job_id, user="root", gpus=1,
                    reason=f"test: {action}")


def _worker(store: Any, d: Decision, env: dict[str, str], fault: str | None) -> subprocess.CompletedProcess[str]:
    child_env = dict(os.environ)
    args = {"store": store.url, "policy": POLICY, "now": d.ts, "run_id": "faults-acting", "env": env,
            "decision": d.to_dict(), "fault": fault}
    return subprocess.run([sys.executable, "-c", WORKER, json.dumps(args)], capture_output=True, text=True,
                          env=child_env, timeout=120)


@pytest.fixture
def job(slurm_cluster) -> Iterator[str]:  # type: ignore[no-untyped-def]
    jid = slurm_cluster.submit("sleep 600\n", "--job-name=faults-acting", "--gres=gpu:1", "--cpus-per-task=1",
                               "--mem=100")
    slurm_cluster.wait_state(jid, "RUNNING", timeout=30)
    yield jid
    slurm_cluster.run("scancel", "--signal=KILL", jid)


def _nice(slurm_cluster: Any, jid: str) -> int:  # type: ignore[no-untyped-def]
    res = slurm_cluster.run("squeue", "-h", "-j", jid, "-o", "%y")
    return int(res.stdout.strip() or 0)


# -- the worker killed mid-action -------------------------------------------------------------------
@pytest.mark.parametrize("point", ["after_started", "after_effect"])
def test_worker_killed_mid_action_then_retried_acts_once(slurm_cluster, job, store, point) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.act.dispatch import action_id

    d = _decision(job, "cancel")
    store.record_decisions([d], "faults-acting", status="decided")
    aid = action_id(d)

    crashed = _worker(store, d, slurm_cluster.env, point)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    row = store.get_action(aid)
    assert row is not None and row["status"] == "started" and row["attempt"] == 1 and row["finished_at"] is None
    if point == "after_started":
        assert slurm_cluster.job_state(job) == "RUNNING", "killed before the effect: the job is untouched"
    else:
        assert slurm_cluster.wait_state(job, ("COMPLETED", "CANCELLED", "FAILED", "GONE"), timeout=30)

    retried = _worker(store, d, slurm_cluster.env, None)
    assert retried.returncode == 0, retried.stderr[-2000:]
    (res,) = json.loads(retried.stdout.strip().splitlines()[-1])
    assert res["status"] == "succeeded" and res["resumed"] is True
    slurm_cluster.wait_state(job, ("COMPLETED", "CANCELLED", "FAILED", "GONE"), timeout=30)
    row = store.get_action(aid)
    assert row["status"] == "succeeded" and row["attempt"] == 2 and row["finished_at"] is not None
    if point == "after_effect":
        # the effect had happened: the retry re-checked, found the job gone and sent nothing again
        assert "already gone" in (row["output"] or "")
    else:
        assert "already gone" not in (row["output"] or "") and "scancel" in (row["output"] or "")
    assert store.get_decision(d.decision_id)["status"] == "acted"
    # a third run of the task: finished rows are never acted on again
    again = _worker(store, d, slurm_cluster.env, None)
    (res,) = json.loads(again.stdout.strip().splitlines()[-1])
    assert res["status"] == "succeeded" and res.get("repeated") is False
    assert len(store.actions_of_decision(d.decision_id)) == 1 and store.get_action(aid)["attempt"] == 2


# -- the audit store unavailable ---------------------------------------------------------------------
def test_audit_store_unavailable_nothing_acts(slurm_cluster, job) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.act import dispatch
    from gpu_cost.act.base import ActionContext
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.core.errors import AuditError
    from gpu_cost.perceive.runner import LocalRunner

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    dead = AuditStore(f"postgresql+psycopg2://agent:pw@127.0.0.1:{closed}/gpu_cost")
    before = _nice(slurm_cluster, job)
    ctx = ActionContext(policy=_policy(), dry_run=False, now=time.time(), run_id="no-audit",
                        slurm=LocalRunner(env=slurm_cluster.env), sleep=time.sleep, extra={"grace_s": 1})
    with pytest.raises(AuditError, match="unavailable"):
        dispatch.execute([_decision(job, "cancel"), _decision(job, "demote", rung=1)], ctx, dead)
    assert slurm_cluster.job_state(job) == "RUNNING" and _nice(slurm_cluster, job) == before


# -- slurmctld restarted mid-sweep -------------------------------------------------------------------
def test_controller_restart_mid_sweep(slurm_cluster, job, store) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.act import dispatch
    from gpu_cost.act.base import ActionContext
    from gpu_cost.perceive.runner import LocalRunner
    from gpu_cost.perceive.slurm import SlurmSource

    # collect: the job is seen running
    assert job in {j.job_id for j in SlurmSource(slurm_cluster.runner).jobs()}
    ctx = ActionContext(policy=_policy(), dry_run=False, now=time.time(), run_id="ctld-restart",
                        slurm=LocalRunner(env=slurm_cluster.env), sleep=time.sleep, extra={"grace_s": 1})
    during = _decision(job, "demote", rule="manual")
    after = _decision(job, "demote")
    seen: dict[str, Any] = {}

    def while_down() -> None:
        t0 = time.monotonic()
        (seen["result"],) = dispatch.execute([during], ctx, store)
        seen["seconds"] = time.monotonic() - t0

    slurm_cluster.restart_controller(while_down)
    assert seen["result"]["status"] == "failed"
    assert "unreachable" in seen["result"]["error"] or "re-check failed" in seen["result"]["error"]
    assert store.get_action(dispatch.action_id(during))["status"] == "failed"
    # the job survived the restart; once the controller answers again, the act after it succeeds, once
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and slurm_cluster.job_state(job) != "RUNNING":
        time.sleep(1)
    assert slurm_cluster.job_state(job) == "RUNNING"
    (res,) = dispatch.execute([after], ctx, store)
    assert res["status"] == "succeeded", res
    assert _nice(slurm_cluster, job) == _policy().demote.nice
    (res,) = dispatch.execute([after], ctx, store)
    assert res["status"] == "succeeded" and res.get("repeated") is False


# -- SSH target unreachable or hanging ---------------------------------------------------------------
@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word (a hung host)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    srv.close()


@pytest.mark.parametrize("kind", ["unreachable", "hanging"])
def test_ssh_target_unreachable_or_hanging_fails_within_timeout(kind, silent_port, store, monkeypatch,  # type: ignore[no-untyped-def]
                                                                 tmp_path) -> None:
    from gpu_cost.act import dispatch
    from gpu_cost.act.base import ActionContext
    from gpu_cost.perceive.nodes import NodeAccess
    from gpu_cost.perceive.runner import SSHRunner

    if kind == "unreachable":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        port = silent_port
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    monkeypatch.setenv("AIRFLOW_CONN_FAULTS_NODE", json.dumps({
        "conn_type": "ssh", "host": "127.0.0.1", "port": port, "login": "root",
        "extra": {"key_file": str(key), "no_host_key_check": True, "look_for_keys": False}}))
    target = "proc:gpu01:4242:1795960000"
    d = Decision(decision_id=decision_id("zombie", target, 1, 1), ts=time.time(), rule="zombie", target_kind="process",
                 target=target, action="kill_process", mode="enforce", rung=1, host="gpu01", gpus=1, user="nobody",
                 reason="test", evidence={"gpu_uuid": "GPU-0000"})
    ctx = ActionContext(policy=_policy(), dry_run=False, now=time.time(), run_id="ssh-fault",
                        node_runner=lambda host: SSHRunner("faults_node", host="127.0.0.1", conn_timeout=2),
                        sleep=time.sleep, extra={"node_access": NodeAccess(conn_id="faults_node"), "kill_grace_s": 1})
    t0 = time.monotonic()
    (res,) = dispatch.execute([d], ctx, store)
    elapsed = time.monotonic() - t0
    assert res["status"] == "failed" and "TERM failed (255)" in res["error"], res
    row = store.get_action(dispatch.action_id(d))
    assert row["status"] == "failed" and "ssh to 127.0.0.1 failed" in (row["output"] or "") + (row["error"] or "")
    # two connection attempts of at most conn_timeout (2 s) each, and the provider's pause between them
    assert elapsed < 60, f"{kind}: {elapsed:.1f}s (a hung host must not hold a task: bounded by the timeouts)"
