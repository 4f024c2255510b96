"""Issue 16's guards against real Slurm and real PostgreSQL.

* The target's identity is checked before the effect: a live job with the decision's id but
  another owner, name or start time (a reused id, a simulated id) is left alone.
* Simulated data never drives an executor that reaches the cluster.
* A pending array record is acted on by its pending tasks (``<id>_[1-3]``), never by the bare
  array id, which would end the running task too.
* Rolling caps are counted in the audit store, in the effect's transaction: two workers racing on
  different targets, one way in against another, and the GPU share of the hour.
"""

from __future__ import annotations

import shlex
import threading
import time
from typing import Any

import pytest

from gpu_cost.act import dispatch, locks
from gpu_cost.act.base import ActionContext, Outcome
from gpu_cost.act.dispatch import action_id, execute
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Decision, decision_id
from gpu_cost.decide.engine import entry_of
from gpu_cost.perceive.slurm import SlurmSource

pytestmark = pytest.mark.integration


def decision(job_id: str, action: str, *, tag: str = "", user: str | None = "root", gpus: int = 1,
             evidence: dict[str, Any] | None = None, rule: str = "idle_allocation") -> Decision:
    return Decision(decision_id=f"g-{action}-{job_id}{tag}", ts=time.time(), rule=rule, target_kind="job",
                    target=f"job:{job_id}", action=action, mode="enforce", job_id=job_id, user=user, gpus=gpus,
                    evidence=evidence or {})


def ctx(cluster: Any, *, source: str | None = None, run_id: str = "gpu_zombie_sweep:guards",
        policy: Policy | None = None, grace: float = 20.0) -> ActionContext:
    return ActionContext(policy=policy or Policy(), dry_run=False, now=time.time(), run_id=run_id,
                         slurm=cluster.runner if cluster is not None else None, sleep=time.sleep,
                         extra={"grace_s": grace}, source=source)


@pytest.fixture
def clean(slurm_cluster):  # type: ignore[no-untyped-def]
    yield slurm_cluster
    slurm_cluster.cancel_all()


def _ended(cluster: Any, jid: str) -> str:
    return cluster.wait_state(jid, ("CANCELLED", "COMPLETED", "FAILED", "GONE"), 30)


# -- 1. the target's identity, checked before the effect -------------------------------------------
def test_a_job_with_the_same_id_but_another_identity_is_left_alone(clean, store) -> None:  # type: ignore[no-untyped-def]
    c = clean
    jid = c.submit("sleep 300", "--job-name=gc-ident", "--gres=gpu:1")
    c.wait_state(jid, "RUNNING", 30)
    real = SlurmSource(c.runner).job(jid)
    assert real is not None and real.user == "root" and real.name == "gc-ident" and real.start_ts, real
    same = {"job_name": real.name, "job_start_ts": real.start_ts}
    others = {
        "user": (dict(same), "alice", "belongs to root"),
        "name": ({**same, "job_name": "someone-elses-training"}, "root", "is named 'gc-ident'"),
        "start": ({**same, "job_start_ts": real.start_ts - 3600.0}, "root", f"started at {real.start_ts:.0f}"),
    }
    for tag, (ev, user, why) in others.items():
        for action in ("terminate", "cancel"):
            d = decision(jid, action, tag=f"-{tag}", user=user, evidence=ev)
            res = execute([d], ctx(c), store)
            assert res[0]["status"] == "skipped", (tag, action, res)
            assert (res[0]["error"] or "").startswith("target changed") and why in res[0]["error"], (tag, action, res)
            row = store.get_action(action_id(d))
            assert row["status"] == "skipped" and (row["error"] or "").startswith("target changed"), row
            assert c.job_state(jid) == "RUNNING", f"{tag}/{action}: the job was touched"
    # the job decided about (owner, name and start as squeue shows them) is cancelled
    d = decision(jid, "cancel", tag="-same", evidence=same)
    res = execute([d], ctx(c), store)
    assert res[0]["status"] == "succeeded", res
    assert _ended(c, jid) != "RUNNING"


# -- 2. simulated data never drives a real executor -------------------------------------------------
def test_simulated_data_never_drives_a_real_executor(clean, store) -> None:  # type: ignore[no-untyped-def]
    c = clean
    jid = c.submit("sleep 300", "--job-name=gc-sim", "--gres=gpu:1")
    c.wait_state(jid, "RUNNING", 30)
    real = SlurmSource(c.runner).job(jid)
    assert real is not None
    ev = {"job_name": real.name, "job_start_ts": real.start_ts}
    for source in ("sim", "trace"):
        d = decision(jid, "cancel", tag=f"-{source}", evidence=ev)
        res = execute([d], ctx(c, source=source), store)
        assert res[0]["status"] == "skipped" and "simulated data" in res[0]["error"], res
        row = store.get_action(action_id(d))
        assert row["status"] == "skipped" and "simulated data" in row["error"], row
        assert c.job_state(jid) == "RUNNING"
    res = execute([decision(jid, "cancel", tag="-real", evidence=ev)], ctx(c, source="prometheus"), store)
    assert res[0]["status"] == "succeeded", res
    assert _ended(c, jid) != "RUNNING"
    jid2 = c.submit("sleep 300", "--job-name=gc-sim2")
    c.wait_state(jid2, "RUNNING", 30)
    res = execute([decision(jid2, "terminate", tag="-none")], ctx(c, source=None), store)
    assert res[0]["status"] == "succeeded", res
    assert _ended(c, jid2) != "RUNNING"


# -- 3. a pending array record is acted on by its pending tasks --------------------------------------
def _array_tasks(cluster: Any, jid: str) -> dict[str, str]:
    res = cluster.run("squeue", "-h", "-r", "-j", jid, "-o", "%i %T")
    assert res.ok, res.stderr
    return dict(line.split() for line in res.stdout.strip().splitlines() if line.strip())


def test_a_pending_array_record_is_acted_on_by_its_tasks_never_the_array_id(clean, store) -> None:  # type: ignore[no-untyped-def]
    c = clean
    jid = c.submit("sleep 300", "--job-name=gc-array", "--array=0-3%1", "--gres=gpu:1")
    c.wait_state(f"{jid}_0", "RUNNING", 30)
    jobs = {j.job_id: j for j in SlurmSource(c.runner).jobs() if j.job_id.split("_", 1)[0] == jid}
    assert f"{jid}_0" in jobs and jobs[f"{jid}_0"].running, sorted(jobs)
    pending = [k for k, j in jobs.items() if j.pending]
    assert len(pending) == 1, sorted(jobs)
    pid = pending[0]
    assert pid.startswith(f"{jid}_[") and pid != jid, pid
    assert pid == f"{jid}_[1-3]", pid
    assert jid not in jobs  # the bare array id names every task: it is never a job id of its own
    # the bare array id is not taken to mean a task: nothing is ended
    res = execute([decision(jid, "terminate", tag="-bare")], ctx(c), store)
    assert res[0]["status"] in ("succeeded", "skipped"), res
    assert _array_tasks(c, jid) == {f"{jid}_0": "RUNNING", f"{jid}_1": "PENDING", f"{jid}_2": "PENDING",
                                    f"{jid}_3": "PENDING"}
    # the pending record: its pending tasks go, the running task stays
    res = execute([decision(pid, "terminate")], ctx(c), store)
    assert res[0]["status"] == "succeeded", res
    assert res[0]["command"] == shlex.join(["scancel", pid]), res  # plain scancel: pending tasks have no process
    deadline = time.monotonic() + 15
    while (tasks := _array_tasks(c, jid)) != {f"{jid}_0": "RUNNING"} and time.monotonic() < deadline:
        time.sleep(0.25)
    assert tasks == {f"{jid}_0": "RUNNING"}, tasks


# -- 4. rolling caps across runs and workers ------------------------------------------------------
def _job_decision(job: str, action: str, *, gpus: int = 1, rule: str = "idle_allocation") -> Decision:
    target = f"job:{job}"
    return Decision(decision_id=decision_id(rule, target, 1, 3), ts=time.time(), rule=rule, target_kind="job",
                    target=target, action=action, mode="enforce", rung=3, job_id=job, user="alice", gpus=gpus)


def _node_decision(node: str, *, gpus: int) -> Decision:
    target = f"node:{node}"
    return Decision(decision_id=decision_id("offhours", target, 1, 0), ts=time.time(), rule="offhours",
                    target_kind="node", target=target, action="power_down", mode="enforce", host=node, gpus=gpus)


def _row(d: Decision, run_id: str, started_at: float) -> dict[str, Any]:
    return {"action_id": action_id(d), "decision_id": d.decision_id, "run_id": run_id, "action": d.action,
            "target": d.target, "executor": "gpu_cost.act.slurm", "dry_run": 0, "started_at": started_at,
            "attempt": 1, "command": None}


def _start(store: AuditStore, d: Decision, run_id: str, policy: Policy, *, now: float,
           total_gpus: int = 100) -> dict[str, Any] | None:
    """Start ``d``'s effect as the dispatcher would, with the rolling caps; return the owner (None: it acts)."""
    store.record_decisions([d], run_id)
    created, owner = locks.start_effect(store, d, _row(d, run_id, now),
                                        caps=locks.CapCheck(policy, entry_of(run_id), total_gpus=total_gpus, now=now))
    assert created
    if owner is None:
        store.action_finished(action_id(d), "succeeded", time.time(), output="acted")
    return owner


ROUNDS = 8


def test_two_workers_on_different_targets_share_one_hourly_cap(pg_store) -> None:  # type: ignore[no-untyped-def]
    policy = parse_policy("caps: {rolling: {max_actions_per_hour: 1}}")
    base = time.time() - 2 * 3600.0 * ROUNDS  # each round two hours after the last: a fresh hour
    for rnd in range(ROUNDS):
        now = base + rnd * 7200.0
        runs = (f"gpu_zombie_sweep:r{rnd}a", f"gpu_manual_reclaim:r{rnd}b")
        ds = [_job_decision(f"{8000 + 10 * rnd + i}", "terminate" if i == 0 else "cancel",
                            rule="idle_allocation" if i == 0 else "manual") for i in range(2)]
        for d, run in zip(ds, runs):
            pg_store.record_decisions([d], run)
        barrier = threading.Barrier(2)
        out: dict[int, Any] = {}

        def work(i: int, now: float = now, ds: list[Decision] = ds, runs: tuple[str, str] = runs,
                 barrier: threading.Barrier = barrier, out: dict[int, Any] = out) -> None:
            try:
                st = AuditStore(pg_store.url)
                st.query("SELECT 1 AS warm")
                barrier.wait(30)
                out[i] = locks.start_effect(st, ds[i], _row(ds[i], runs[i], now),
                                            caps=locks.CapCheck(policy, entry_of(runs[i]), total_gpus=100, now=now))
            except Exception as exc:  # reported below
                out[i] = exc

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(isinstance(v, Exception) for v in out.values()) and len(out) == 2, out
        assert all(created for created, _ in out.values()), out
        owners = [owner for _, owner in out.values()]
        assert sum(o is None for o in owners) == 1, f"round {rnd}: {owners}"
        loser_i = next(i for i, (_, o) in out.items() if o is not None)
        cap = out[loser_i][1]["cap"]
        assert "caps.rolling.max_actions_per_hour=1" in cap, cap
        row = pg_store.get_action(action_id(ds[loser_i]))
        assert row["status"] == "skipped" and row["error"] == cap, row
        winner = pg_store.get_action(action_id(ds[1 - loser_i]))
        assert winner["status"] == "started", winner
        pg_store.action_finished(winner["action_id"], "succeeded", time.time(), output="acted")


def test_a_per_entry_limit_stops_that_way_in_only(pg_store) -> None:  # type: ignore[no-untyped-def]
    policy = parse_policy("caps: {entry_points: {manual: {max_actions_per_hour: 1}}}")
    now = time.time()
    assert _start(pg_store, _job_decision("8101", "cancel", rule="manual"), "gpu_manual_reclaim:r1", policy,
                  now=now) is None
    owner = _start(pg_store, _job_decision("8102", "cancel", rule="manual"), "gpu_manual_reclaim:r2", policy,
                   now=now + 1)
    assert owner is not None and "caps.entry_points.manual.max_actions_per_hour=1" in owner["cap"], owner
    row = pg_store.get_action(action_id(_job_decision("8102", "cancel", rule="manual")))
    assert row["status"] == "skipped" and row["error"] == owner["cap"], row
    # the sweep is another way in: the manual limit does not hold for it (the rolling total does: 40)
    assert _start(pg_store, _job_decision("8103", "terminate"), "gpu_zombie_sweep:r3", policy, now=now + 2) is None
    assert _start(pg_store, _job_decision("8104", "terminate"), "gpu_zombie_sweep:r4", policy, now=now + 3) is None
    # an hour later the manual reclaim may act again
    assert _start(pg_store, _job_decision("8105", "cancel", rule="manual"), "gpu_manual_reclaim:r5", policy,
                  now=now + 3700) is None


def test_the_hourly_gpu_share_counts_work_not_powered_down_nodes(pg_store) -> None:  # type: ignore[no-untyped-def]
    policy = parse_policy("caps: {rolling: {max_gpu_share_per_hour: 0.25}}")
    now = time.time()
    total = 16  # a quarter: 4 GPUs an hour
    assert _start(pg_store, _job_decision("8201", "terminate", gpus=3), "gpu_zombie_sweep:s1", policy, now=now,
                  total_gpus=total) is None
    # powering down an idle node touches no work: neither counted nor stopped by the share
    assert _start(pg_store, _node_decision("gn1", gpus=8), "gpu_offhours_power:p1", policy, now=now + 1,
                  total_gpus=total) is None
    over = _job_decision("8202", "cancel", gpus=2, rule="manual")
    owner = _start(pg_store, over, "gpu_manual_reclaim:m1", policy, now=now + 2, total_gpus=total)
    assert owner is not None, "5 of 16 GPUs in an hour is over a 25% share"
    assert "5 of 16 GPUs" in owner["cap"] and "caps.rolling.max_gpu_share_per_hour" in owner["cap"], owner
    row = pg_store.get_action(action_id(over))
    assert row["status"] == "skipped" and row["error"] == owner["cap"], row
    # one GPU more is exactly the share: allowed (the skipped row counts nothing)
    assert _start(pg_store, _job_decision("8203", "terminate", gpus=1), "gpu_zombie_sweep:s2", policy, now=now + 3,
                  total_gpus=total) is None
    assert _start(pg_store, _node_decision("gn2", gpus=8), "gpu_offhours_power:p2", policy, now=now + 4,
                  total_gpus=total) is None
    owner = _start(pg_store, _job_decision("8204", "terminate", gpus=1), "gpu_zombie_sweep:s3", policy,
                   now=now + 5, total_gpus=total)
    assert owner is not None and "would touch 5 of 16 GPUs" in owner["cap"], owner


# -- the same through the dispatcher, on SQLite ------------------------------------------------------
def test_the_dispatcher_counts_the_cap_over_runs_for_cluster_executors(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dispatch.load_executors()  # imported first, so the real executors never replace the stand-in below
    calls: list[str] = []

    def fake_cancel(d: Decision, c: ActionContext) -> Outcome:
        calls.append(d.target)
        return Outcome("succeeded", output="cancelled (stand-in)")

    fake_cancel.touches_cluster = True  # type: ignore[attr-defined]
    monkeypatch.setitem(dispatch.REGISTRY, "cancel", fake_cancel)
    policy = parse_policy("caps: {rolling: {max_actions_per_hour: 1}}")
    first = execute([decision("8301", "cancel")], ctx(None, run_id="gpu_zombie_sweep:r1", policy=policy), store)
    assert first[0]["status"] == "succeeded", first
    second = execute([decision("8302", "cancel")], ctx(None, run_id="gpu_manual_reclaim:r2", policy=policy), store)
    assert second[0]["status"] == "skipped", second
    assert "caps.rolling.max_actions_per_hour=1" in second[0]["error"], second
    assert calls == ["job:8301"]
    row = store.get_action(second[0]["action_id"])
    assert row["status"] == "skipped" and "caps.rolling.max_actions_per_hour=1" in row["error"], row
    # an executor that reaches nothing (a simulated week's) is not counted against the cap
    fake_cancel.touches_cluster = False  # type: ignore[attr-defined]
    third = execute([decision("8303", "cancel")], ctx(None, run_id="gpu_zombie_sweep:r3", policy=policy), store)
    assert third[0]["status"] == "succeeded" and calls == ["job:8301", "job:8303"], third
