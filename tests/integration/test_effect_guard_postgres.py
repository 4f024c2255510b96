"""The effect guard (:func:`gpu_cost.act.locks.start_effect`) on a real PostgreSQL server.

On PostgreSQL the ``started`` row and the look at the target's other rows are serialised per
target by a transaction advisory lock. Here separate worker processes, each with its own
:class:`~gpu_cost.audit.store.AuditStore` and connection on the same database, race on fresh
targets round after round (the sweep's ``idle_allocation`` terminate against an operator's
``manual`` cancel): exactly one acts, the other is skipped naming it. A connection holding the
target's advisory lock (key from :func:`gpu_cost.act.locks.effect_lock_key`) shows the lock is what
serialises them; other targets, the same rule's ladder and dry-run rows are not blocked.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from typing import Any

import pytest

from gpu_cost.core.model import Decision, decision_id

pytestmark = pytest.mark.integration

ROUNDS = 20
SWEEP = ("idle_allocation", "terminate", "gpu_zombie_sweep:race")
MANUAL = ("manual", "cancel", "gpu_manual_reclaim:race")
#: a site whose policy ends low-efficiency jobs too: a third worker on the same effect
THIRD = ("low_efficiency", "kill", "gpu_zombie_sweep:race-le")


def _decision(rule: str, job_id: str, action: str, *, rung: int = 3, mode: str = "enforce") -> Decision:
    target = f"job:{job_id}"
    return Decision(decision_id=decision_id(rule, target, 1, rung), ts=time.time(), rule=rule, target_kind="job",
                    target=target, action=action, mode=mode, rung=rung, job_id=job_id, user="alice", gpus=2,
                    reason=f"{rule}: {action}")


def _row(d: Decision, run_id: str, *, dry_run: bool = False, started_at: float | None = None) -> dict[str, Any]:
    """The ``action_started`` parameters, as the dispatcher builds them."""
    from gpu_cost.act.dispatch import action_id

    return {"action_id": action_id(d), "decision_id": d.decision_id, "run_id": run_id, "action": d.action,
            "target": d.target, "executor": "gpu_cost.act.slurm", "dry_run": int(dry_run),
            "started_at": time.time() if started_at is None else started_at, "attempt": 1, "command": None}


def _race_worker(url: str, who: tuple[str, str, str], jobs: list[str], barrier: Any, out: Any) -> None:
    """One worker process: its own store and connection; per round, wait for the others, then start."""
    from gpu_cost.act import locks
    from gpu_cost.audit.store import AuditStore

    store = AuditStore(url).ensure_schema()
    store.query("SELECT 1 AS warm")  # the connection is open before the first round
    rule, action, run_id = who
    for job in jobs:
        d = _decision(rule, job, action)
        row = _row(d, run_id)
        barrier.wait(60)
        created, owner = locks.start_effect(store, d, row)
        if owner is None:
            # this worker acts (the executor would run here) and records it, as the dispatcher does
            store.action_finished(row["action_id"], "succeeded", time.time(), output="acted")
        else:
            store.action_finished(row["action_id"], "skipped", time.time(),
                                  error=f"{d.target}: already {owner['status']} by action {owner['action_id']}")
        out.put({"job": job, "rule": rule, "action_id": row["action_id"], "created": created,
                 "owner": None if owner is None else str(owner["action_id"])})


def _race(store: Any, workers: list[tuple[str, str, str]], jobs: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Race ``workers`` (separate processes) on each job in turn; return their results per job."""
    for rule, action, run_id in workers:
        store.record_decisions([_decision(rule, j, action) for j in jobs], run_id)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(workers))
    out = ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(store.url, w, jobs, barrier, out), daemon=True) for w in workers]
    for p in procs:
        p.start()
    results: dict[str, list[dict[str, Any]]] = {j: [] for j in jobs}
    try:
        for _ in range(len(jobs) * len(workers)):
            r = out.get(timeout=120)
            results[r["job"]].append(r)
    except queue.Empty:
        pytest.fail(f"race workers stopped answering (exit codes {[p.exitcode for p in procs]})")
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return results


def _statuses(store: Any, target: str) -> list[dict[str, Any]]:
    return store.query("SELECT action_id, status, error FROM gpu_cost_actions WHERE target = :t ORDER BY action_id",
                       {"t": target})


def test_sweep_and_manual_reclaim_racing_make_one_action_every_round(pg_store) -> None:  # type: ignore[no-untyped-def]
    jobs = [str(7000 + i) for i in range(ROUNDS)]
    results = _race(pg_store, [SWEEP, MANUAL], jobs)
    winners = {"idle_allocation": 0, "manual": 0}
    for job in jobs:
        rs = results[job]
        assert all(r["created"] for r in rs), rs
        acted = [r for r in rs if r["owner"] is None]
        skipped = [r for r in rs if r["owner"] is not None]
        assert len(acted) == 1 and len(skipped) == 1, f"job {job}: {rs}"
        assert skipped[0]["owner"] == acted[0]["action_id"], f"job {job}: the loser names the winner: {rs}"
        winners[acted[0]["rule"]] += 1
        rows = _statuses(pg_store, f"job:{job}")
        assert sorted(r["status"] for r in rows) == ["skipped", "succeeded"], rows
        loser_row = next(r for r in rows if r["status"] == "skipped")
        assert acted[0]["action_id"] in loser_row["error"]
    assert sum(winners.values()) == ROUNDS


def test_three_workers_on_one_effect_still_make_one_action(pg_store) -> None:  # type: ignore[no-untyped-def]
    jobs = [str(7100 + i) for i in range(ROUNDS // 2)]
    results = _race(pg_store, [SWEEP, MANUAL, THIRD], jobs)
    for job in jobs:
        rs = results[job]
        acted = [r for r in rs if r["owner"] is None]
        assert len(acted) == 1, f"job {job}: {rs}"
        # a loser's row is skipped in the transaction that found the owner: each names the winner
        assert all(r["owner"] == acted[0]["action_id"] for r in rs if r["owner"] is not None), rs
        rows = _statuses(pg_store, f"job:{job}")
        assert sorted(r["status"] for r in rows) == ["skipped", "skipped", "succeeded"], rows
        assert all(acted[0]["action_id"] in r["error"] for r in rows if r["status"] == "skipped"), rows


def _lock_waiters(conn: Any) -> int:
    import sqlalchemy as sa

    return int(conn.execute(sa.text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")).scalar_one())


def _wait_for(pred: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting: {what}")
        time.sleep(0.05)


def _start_in_thread(url: str, d: Decision, row: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    from gpu_cost.act import locks
    from gpu_cost.audit.store import AuditStore

    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["created"], result["owner"] = locks.start_effect(AuditStore(url), d, row)
        except Exception as exc:  # reported by the test
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def test_the_advisory_lock_of_the_target_is_what_serialises(pg_store) -> None:  # type: ignore[no-untyped-def]
    """While another transaction holds the target's lock, start_effect waits; then it sees that transaction's row."""
    import sqlalchemy as sa

    from gpu_cost.act import locks
    from gpu_cost.act.dispatch import action_id
    from gpu_cost.audit.store import _bind, queries

    manual = _decision("manual", "7201", "cancel")
    sweep = _decision("idle_allocation", "7201", "terminate")
    pg_store.record_decisions([manual], MANUAL[2])
    pg_store.record_decisions([sweep], SWEEP[2])
    with pg_store.engine.connect() as holder, pg_store.engine.connect() as observer:
        tx = holder.begin()
        holder.execute(sa.text(locks.EFFECT_LOCK_SQL), {"key": locks.effect_lock_key(manual.target)})
        # the lock holder is the operator's reclaim, mid-transaction: its row is written but not committed
        holder.execute(sa.text(queries()["action_started"]), _bind(_row(manual, MANUAL[2])))
        t, result = _start_in_thread(pg_store.url, sweep, _row(sweep, SWEEP[2]))
        _wait_for(lambda: _lock_waiters(observer) == 1, "start_effect to wait on the target's advisory lock")
        assert t.is_alive() and not result
        seen = observer.execute(sa.text("SELECT count(*) FROM gpu_cost_actions WHERE target = :t"),
                                {"t": sweep.target}).scalar_one()
        assert seen == 0, "nothing is committed while the lock is held"
        tx.commit()
        t.join(30)
        assert not t.is_alive() and "error" not in result, result
        assert _lock_waiters(observer) == 0
    # having waited, it saw the holder's row: the sweep must not act
    assert result["created"] is True
    assert result["owner"] is not None and result["owner"]["action_id"] == action_id(manual)
    assert result["owner"]["status"] == "started"


def test_another_target_is_not_blocked_by_the_lock(pg_store) -> None:  # type: ignore[no-untyped-def]
    import sqlalchemy as sa

    from gpu_cost.act import locks

    held = _decision("manual", "7301", "cancel")
    other = _decision("idle_allocation", "7302", "terminate")
    pg_store.record_decisions([other], SWEEP[2])
    with pg_store.engine.connect() as holder:
        tx = holder.begin()
        holder.execute(sa.text(locks.EFFECT_LOCK_SQL), {"key": locks.effect_lock_key(held.target)})
        t, result = _start_in_thread(pg_store.url, other, _row(other, SWEEP[2]))
        t.join(30)
        finished_while_held = not t.is_alive()
        tx.rollback()
    t.join(30)
    assert finished_while_held, "start_effect on job:7302 waited for job:7301's lock"
    assert result == {"created": True, "owner": None}


def test_what_does_not_block(pg_store) -> None:  # type: ignore[no-untyped-def]
    """The same rule's ladder, dry-run rows, another effect and rows older than the window never block."""
    from gpu_cost.act import locks

    now = time.time()
    # the ladder: terminate still in flight, then the same rule's kill on the same job
    term = _decision("idle_allocation", "7401", "terminate", rung=3)
    kill = _decision("idle_allocation", "7401", "kill", rung=4)
    manual = _decision("manual", "7401", "cancel")
    pg_store.record_decisions([term, kill], SWEEP[2])
    pg_store.record_decisions([manual], MANUAL[2])
    assert locks.start_effect(pg_store, term, _row(term, SWEEP[2])) == (True, None)
    assert locks.start_effect(pg_store, kill, _row(kill, SWEEP[2])) == (True, None)
    # ... but another rule's decision on that job is blocked by them (the guard is on)
    created, owner = locks.start_effect(pg_store, manual, _row(manual, MANUAL[2]))
    assert created and owner is not None and owner["action_id"] in {f"{term.decision_id}:terminate",
                                                                     f"{kill.decision_id}:kill"}

    # dry-run rows, started and succeeded, never block
    dry = _decision("manual", "7402", "cancel", mode="dry-run")
    pg_store.record_decisions([dry], MANUAL[2])
    assert pg_store.action_started(action_id=f"{dry.decision_id}:cancel", decision_id=dry.decision_id,
                                   run_id=MANUAL[2], action="cancel", target=dry.target, executor="test",
                                   dry_run=True, started_at=now)
    dry2 = _decision("low_efficiency", "7402", "kill", mode="dry-run")
    pg_store.record_decisions([dry2], THIRD[2])
    pg_store.action_started(action_id=f"{dry2.decision_id}:kill", decision_id=dry2.decision_id, run_id=THIRD[2],
                            action="kill", target=dry2.target, executor="test", dry_run=True, started_at=now)
    pg_store.action_finished(f"{dry2.decision_id}:kill", "succeeded", now)
    sweep = _decision("idle_allocation", "7402", "terminate")
    pg_store.record_decisions([sweep], SWEEP[2])
    assert locks.start_effect(pg_store, sweep, _row(sweep, SWEEP[2])) == (True, None)

    # another effect (an operator's demote) does not block the end of the job
    demote = _decision("manual", "7403", "demote")
    cancel = _decision("idle_allocation", "7403", "cancel")
    pg_store.record_decisions([demote], MANUAL[2])
    pg_store.record_decisions([cancel], SWEEP[2])
    assert locks.start_effect(pg_store, demote, _row(demote, MANUAL[2])) == (True, None)
    assert locks.start_effect(pg_store, cancel, _row(cancel, SWEEP[2])) == (True, None)

    # a success older than the window no longer owns the effect; a recent one does
    old = _decision("manual", "7404", "cancel")
    pg_store.record_decisions([old], MANUAL[2])
    pg_store.action_started(action_id=f"{old.decision_id}:cancel", decision_id=old.decision_id, run_id=MANUAL[2],
                            action="cancel", target=old.target, executor="test", dry_run=False,
                            started_at=now - 2 * locks.EFFECT_WINDOW_S)
    pg_store.action_finished(f"{old.decision_id}:cancel", "succeeded", now - 2 * locks.EFFECT_WINDOW_S)
    late = _decision("idle_allocation", "7404", "terminate")
    pg_store.record_decisions([late], SWEEP[2])
    assert locks.start_effect(pg_store, late, _row(late, SWEEP[2], started_at=now)) == (True, None)
    again = _decision("low_efficiency", "7404", "kill")
    pg_store.record_decisions([again], THIRD[2])
    created, owner = locks.start_effect(pg_store, again, _row(again, THIRD[2], started_at=now))
    assert created and owner is not None and owner["action_id"] == f"{late.decision_id}:terminate"
