"""Replay a simulated week into an audit store, so a report has a week of history to show.

Used by the demo (its store holds one real sweep) and by the tests. The week is *replayed*, not
waited for: :func:`gpu_cost.loop.sweep.run_once` at hourly steps over a generated 7-day cluster
(``generate_scenario(days=7)``, anchored at the end of the week), each sweep's usage written with
:func:`gpu_cost.report.usage.record_usage`, and the acting decisions carried out through the real
one act step (:func:`gpu_cost.act.step.act_run`: the run's caps, then audit rows before and after, escalation,
savings ledger). Only the effect is simulated, as the cluster is: while the replay runs, the
executors are the simulator's own, which end the job (or the lingering process) in the scenario
so later sweeps see the GPUs free. Runs are recorded under ``dag_id = gpu-cost-seed``.

Arrivals are thinned at night (half of them) and at weekends (four in five): a working-hours rhythm
for the heat map, and quiet weekend nights the off-hours power DAG has idle nodes in. Users and
teams get readable names. Approvals are answered by a simulated on-call (``sim-oncall``):
approved when the work at risk is under three times the policy threshold, otherwise rejected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_cost.act.base import ActionContext, Outcome
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Mode, Policy
from gpu_cost.core.model import Decision

logger = logging.getLogger(__name__)

SEED_DAG_ID = "gpu-cost-seed"
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar")
TEAMS = {"alice": "nlp", "bob": "vision", "carol": "nlp", "dave": "vision", "erin": "platform", "frank": "speech",
         "grace": "research", "heidi": "vision", "ivan": "speech", "judy": "research", "mallory": "nlp",
         "oscar": "platform"}
WEEK = 7 * 86400.0
#: the share of arrivals dropped at weekends and at night (20:00-07:00 UTC): a working-hours rhythm
QUIET_WEEKEND, QUIET_NIGHT = 0.8, 0.5
#: the demo's week ends at this weekday (Monday 0) and hour, UTC: a weekend night, inside the shipped
#: policy's off-hours windows, when the quiet week leaves nodes idle for the power DAG
DEMO_WEEKDAY, DEMO_HOUR = 6, 3
#: the seed of the demo's generated cluster: one whose Sunday night is quiet enough (cluster utilisation
#: under the shipped ``offhours.util_max``) for the power DAG to have idle nodes to power down
DEMO_SEED = 7


def _unit(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def demo_instant(now: float) -> float:
    """Return the instant the demo's week ends at: the latest Sunday 03:00 UTC (:data:`DEMO_WEEKDAY`,
    :data:`DEMO_HOUR`) at or before ``now``.

    Every run of the demo, on any machine and at any time of the week, replays the same week
    relative to that instant and runs its DAGs at it, so it shows the same figures; only the dates
    move, a week at a time.
    """
    day = 86400.0
    midnight = now // day * day
    weekday = int(midnight // day + 3) % 7  # 1970-01-01 was a Thursday (3)
    t = midnight - ((weekday - DEMO_WEEKDAY) % 7) * day + DEMO_HOUR * 3600.0
    return float(t if t <= now else t - WEEK)


def week_scenario(end: float, *, nodes: int = 8, gpus_per_node: int = 8, seed: int = 11, days: float = 7.0) -> Any:
    """Return a generated ``days``-day cluster anchored at ``end``, with readable names and a weekly rhythm."""
    import datetime as dt

    from gpu_cost.sim.cluster import generate_scenario

    sc = generate_scenario(nodes=nodes, gpus_per_node=gpus_per_node, days=days, seed=seed, jobs_per_node=3.0,
                           pending=0)
    jobs = []
    for j in sc.jobs:
        if j.start is not None:
            t = dt.datetime.fromtimestamp(end + j.start, tz=dt.UTC)
            night = t.hour < 7 or t.hour >= 20
            drop = QUIET_WEEKEND if t.weekday() >= 5 else (QUIET_NIGHT if night else 0.0)
            if _unit(f"{seed}:{j.job_id}:quiet") < drop:
                continue
        user = USERS[int(_unit(f"{seed}:{j.job_id}:user") * len(USERS)) % len(USERS)]
        jobs.append(dataclasses.replace(j, user=user, account=TEAMS[user]))
    return dataclasses.replace(sc, jobs=tuple(jobs), anchor=float(end), source="<seeded week>")


def demo_scenario(end: float, *, seed: int = DEMO_SEED, days: float = 7.0) -> Any:
    """Return the demo's one simulated cluster: the week before ``end`` (:func:`week_scenario`) with the
    shipped default cluster (``gpu01``-``gpu03``, jobs 1001-1008) running at ``end``, all anchored there.

    The demo writes it to a scenario file and points every DAG at it (``GPU_COST_SCENARIO``), so the
    forecast, the sweep, the power plan and the weekly report all see the same cluster and week.
    """
    from gpu_cost.sim.cluster import load_scenario

    shipped = load_scenario()
    week = week_scenario(end, seed=seed, days=days)
    nodes = (*shipped.nodes, *week.nodes)
    return dataclasses.replace(week, nodes=nodes, jobs=(*shipped.jobs, *week.jobs), anchor=float(end),
                               node_index={n.name: i for i, n in enumerate(nodes)}, source="<demo cluster>")


def without_shipped_jobs(cluster: Any) -> Any:
    """Return the demo cluster with the shipped cluster's jobs (1001-1008) left out, its nodes kept.

    The demo replays its week on this one: the DAGs' sweep at the week's end is the agent's first look
    at the shipped jobs, so every one of them gets its first decision there (the summary lists them).
    """
    from gpu_cost.sim.cluster import load_scenario

    shipped = {j.job_id for j in load_scenario().jobs}
    return dataclasses.replace(cluster, jobs=tuple(j for j in cluster.jobs if j.job_id not in shipped))


class _SimEffects:
    """The simulator's executors: record the effect of an action in the replayed scenario."""

    def __init__(self, scenario: Any) -> None:
        self.scenario = scenario

    def gpus(self) -> int:
        """The simulated cluster's GPU count (what a snapshot would say)."""
        return int(sum(n.gpus for n in self.scenario.nodes))

    def __call__(self, d: Decision, ctx: ActionContext) -> Outcome:
        anchor = float(self.scenario.anchor)
        offset = ctx.now - anchor
        if d.action in ("cancel", "terminate", "kill", "requeue") and d.job_id:
            return self._end_job(d.job_id, offset, f"scancel {d.job_id}")
        if d.action == "kill_process":
            return self._end_process(d.target, offset)
        return Outcome("succeeded", output="simulated", command=f"(simulated) {d.action} {d.target}")

    def _replace(self, job_id: str, **changes: Any) -> bool:
        jobs = list(self.scenario.jobs)
        for i, j in enumerate(jobs):
            if j.job_id == job_id:
                jobs[i] = dataclasses.replace(j, **changes)
                self.scenario = dataclasses.replace(self.scenario, jobs=tuple(jobs))
                return True
        return False

    def _end_job(self, job_id: str, offset: float, command: str) -> Outcome:
        job = next((j for j in self.scenario.jobs if j.job_id == job_id), None)
        if job is None or (job.end is not None and job.end <= offset):
            return Outcome("succeeded", output="already gone", command=command, details={"already_gone": True})
        self._replace(job_id, end=offset, linger=0.0)
        return Outcome("succeeded", output="simulated", command=f"(simulated) {command}")

    def _end_process(self, target: str, offset: float) -> Outcome:
        parts = target.split(":")
        host, pid = (parts[1], int(parts[2])) if len(parts) >= 3 and parts[2].isdigit() else ("", -1)
        for j in self.scenario.jobs:
            digits = int("".join(c for c in j.job_id if c.isdigit()) or "0")
            if j.node == host and 10000 + digits % 50000 == pid and j.behaviour == "zombie" and j.end is not None:
                if j.linger is not None and j.end + j.linger <= offset:
                    break
                self._replace(j.job_id, linger=max(0.0, offset - j.end))
                return Outcome("succeeded", output="simulated", command=f"(simulated) kill -TERM {pid} on {host}")
        return Outcome("succeeded", output="already gone", command=f"kill {pid}", details={"already_gone": True})


def decision_from_row(row: Mapping[str, Any]) -> Decision:
    """Return the :class:`Decision` stored in a ``gpu_cost_decisions`` row."""
    return Decision.from_row(row)


def seed_week(store: AuditStore, policy: Policy, end: float, *, nodes: int = 8, gpus_per_node: int = 8,
              seed: int = 11, step_s: float = 3600.0, mode: Mode = "enforce",
              scenario: Any | None = None, days: float = 7.0) -> dict[str, Any]:
    """Replay the ``days`` (a week) ending at ``end`` into ``store``; return counts of what was written.

    :param scenario: the cluster to replay (default: :func:`week_scenario` of ``end``).
    """
    # importing the ledger registers its hook (the dispatcher does the same with its executor modules)
    import gpu_cost.act.savings  # noqa: F401
    from gpu_cost.act import dispatch
    from gpu_cost.act.step import CapExceeded, act_run
    from gpu_cost.loop import sweep
    from gpu_cost.report.usage import record_usage

    started = time.time()
    store.ensure_schema()
    pol = dataclasses.replace(policy, mode=mode, sweep=dataclasses.replace(policy.sweep, interval=step_s))
    object.__setattr__(pol, "source", f"{policy.source} (seeded week, mode {mode})")
    effects = _SimEffects(scenario if scenario is not None else
                          week_scenario(end, nodes=nodes, gpus_per_node=gpus_per_node, seed=seed, days=days))
    counts: dict[str, Any] = {"sweeps": 0, "decisions": 0, "executed": 0, "approved": 0, "rejected": 0}
    span = days * 86400.0
    steps = int(span // step_s)
    with dispatch.simulated_executors(effects):
        for k in range(steps):
            t = end - span + (k + 1) * step_s
            run_id = f"{SEED_DAG_ID}:{int(t)}"
            out = sweep.run_once(pol, t, store, run_id=run_id, source="sim", dag_id=SEED_DAG_ID,
                                 scenario=effects.scenario)
            if not store.query("SELECT 1 FROM gpu_cost_jobs_usage WHERE ts = :ts LIMIT 1", {"ts": t}):
                # the sweep did not write the per-job record itself: write both usage tables from the
                # same (deterministic) snapshot
                snap = sweep.collect(pol, t, "sim", scenario=effects.scenario)
                record_usage(store, snap, pol, step_s)
            counts["sweeps"] += 1
            counts["decisions"] += len(out["decisions"])
            # the simulated on-call answers what the run asked; then the one act step carries out what may act
            for row in store.decisions_of_run(run_id):
                if row["mode"] == "dry-run" or row["action"] == "none" or row["status"] != "decided":
                    continue
                if row["requires_approval"] and row.get("approval_status") in (None, "pending"):
                    ok = float(row["gpu_hours_at_risk"] or 0) <= 3 * pol.approval.gpu_hours_at_risk
                    store.set_approval(row["decision_id"], "approved" if ok else "rejected", "sim-oncall", t)
                    counts["approved" if ok else "rejected"] += 1
                    if not ok:
                        store.set_decision_status(row["decision_id"], "rejected")
            def context(now: float, total: int, run: Any, rid: str = run_id) -> ActionContext:
                return ActionContext(policy=pol, dry_run=False, now=now, run_id=rid, cluster_gpus=total)

            try:
                out_act = act_run(store, run_id, pol, "all", simulated_gpus=effects.gpus(), context=context)
                counts["executed"] += out_act.by_status().get("succeeded", 0)
            except CapExceeded as exc:
                counts["capped"] = counts.get("capped", 0) + 1
                logger.info("seeded week, %s: %s", run_id, exc)
    counts["seconds"] = round(time.time() - started, 1)
    logger.info("seeded week ending %s: %s", end, counts)
    return counts


def demo_report(store: AuditStore, home: Path, result: dict[str, Any]) -> None:
    """Demo hook: write the weekly report of the demo's week (seeded before the DAGs ran) and put its
    paths and headline in ``result``."""
    from gpu_cost.config.loader import load_policy
    from gpu_cost.report.kpis import recent_period
    from gpu_cost.report.render import build_report

    # the 7 days of data ending at the DAGs' sweep (the week's end): the period `gpu-cost report --since
    # 7d` reads from the same store, whenever it is run
    since, until = recent_period(store, WEEK, float(result["week_end"]))
    out = build_report(store, load_policy(None), since, until, home / "reports")
    result["report"] = out["index"]
    result["report_summary"] = out["summary"]
    result["report_headline"] = out["headline"]
