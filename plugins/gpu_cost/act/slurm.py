"""Slurm actions: demote, hold, requeue, terminate, kill, and the cancel ladder — via Slurm's own commands.

Every executor re-checks the job first (``squeue --json --jobs <id>``): a job Slurm no longer
lists, or lists as finished, counts as done (``succeeded``, output ``already gone``). In dry-run
nothing runs: the outcome is ``skipped`` with the command that would have run. Commands are
argument lists run by ``ctx.slurm`` (locally, or on a login node over the SSH provider); a job
name full of quotes and ``;`` never reaches a shell.

=========== ============================================================================
``demote``  ``scontrol update jobid=<id> nice=<demote.nice> [qos=..] [partition=..]`` (the policy's
            ``demote:`` section, :class:`DemoteConfig`, declared here)
``hold``    ``scontrol hold <id>`` (pending jobs)
``requeue`` ``scontrol requeue <id>``
``terminate`` ``scancel --signal=TERM --full <id>`` (a pending job: plain ``scancel``)
``kill``    ``scancel --signal=KILL --full <id>`` (a pending job: plain ``scancel``)
``cancel``  the ladder in one action: TERM, wait ``extra["grace_s"]`` (default 60 s), check,
            then KILL if the job is still there
=========== ============================================================================

Least privilege: run these as a Slurm *operator*, not root or a Slurm administrator::

    sacctmgr -i add user gpucost account=root adminlevel=operator

An operator may update, hold, requeue and signal/cancel any job, but cannot change the
cluster's configuration, accounts or associations. (A QOS or partition move needs the QOS to
exist and the job's association to be allowed to use it.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from gpu_cost.act.base import ActionContext, Outcome, register
from gpu_cost.config.schema import Policy
from gpu_cost.config.typed import Invalid, Range
from gpu_cost.core import registry
from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import Decision, Job
from gpu_cost.core.registry import ActionSpec
from gpu_cost.perceive.runner import Completed, Runner

logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 60.0
GONE = "already gone"

_GONE_MARKERS = ("invalid job id", "job has already finished", "already completing or completed",
                 "job/step already completing", "job is no longer pending execution")
_DENIED_MARKERS = ("access/permission denied", "invalid user id", "permission denied", "not authorized",
                   "user not authorized", "must be operator")
_UNREACHABLE_MARKERS = ("unable to contact slurm controller", "connection refused", "socket timed out",
                        "zero bytes were transmitted", "slurm_load_jobs error: unable", "communication connection failure",
                        "ssh to ", "timed out after", "failed while looking for jobs")


def _runner(ctx: ActionContext) -> Runner:
    if ctx.slurm is not None:
        return ctx.slurm
    from gpu_cost.perceive.slurm import default_runner

    return default_runner()


def _sleep(ctx: ActionContext, seconds: float) -> None:
    (ctx.sleep or time.sleep)(seconds)


def job_id_of(d: Decision) -> str:
    """Return the Slurm job id of a decision (``job_id`` or a ``job:<id>`` target)."""
    from gpu_cost.perceive.slurm import check_job_id

    raw = d.job_id or (d.target[4:] if d.target.startswith("job:") else None)
    if not raw:
        raise ValueError(f"decision {d.decision_id} targets {d.target!r}, not a Slurm job")
    try:
        # opaque text (a SLUID is no number), but only a job id ever becomes a command argument
        return check_job_id(raw, f"decision {d.decision_id}")
    except SourceError as exc:
        raise ValueError(str(exc)) from None


def classify(res: Completed) -> str:
    """Return ``ok``, ``gone``, ``denied``, ``unreachable`` or ``error`` for a command's result."""
    text = (res.stderr + " " + res.stdout).lower()
    if res.ok and not any(m in text for m in _GONE_MARKERS):
        return "ok"
    if any(m in text for m in _GONE_MARKERS):
        return "gone"
    if any(m in text for m in _DENIED_MARKERS):
        return "denied"
    if res.rc in (124, 255) or any(m in text for m in _UNREACHABLE_MARKERS):
        return "unreachable"
    return "error"


def _outcome(res: Completed, job_id: str, action: str, details: dict[str, object] | None = None) -> Outcome:
    kind = classify(res)
    det = {"job_id": job_id, "rc": res.rc, **(details or {})}
    msg = (res.stderr.strip() or res.stdout.strip())[:500]
    if kind == "ok":
        return Outcome("succeeded", output=res.stdout.strip()[:500], command=res.command, details=det)
    if kind == "gone":
        return Outcome("succeeded", output=GONE, command=res.command, details={**det, "already_gone": True})
    if kind == "denied":
        return Outcome("failed", error=f"permission denied ({action} job {job_id}): {msg}", command=res.command,
                       details=det)
    if kind == "unreachable":
        return Outcome("failed", error=f"Slurm controller unreachable ({action} job {job_id}): {msg}",
                       command=res.command, details=det)
    return Outcome("failed", error=f"{action} job {job_id} failed (exit {res.rc}): {msg}", command=res.command,
                   details=det)


def current_job(runner: Runner, job_id: str) -> Job | None:
    """Return the job as Slurm lists it now; None when it is gone or finished."""
    from gpu_cost.perceive.slurm import TERMINAL_STATES, SlurmSource

    job = SlurmSource(runner, timeout=30.0).job(job_id)
    if job is None or job.state in TERMINAL_STATES or job.state == "COMPLETING":
        return None
    return job


def _precheck(d: Decision, ctx: ActionContext, argv: Sequence[str]) -> tuple[str, Job | None, Outcome | None]:
    """Common start of every executor: job id, dry-run, re-check. Returns (job_id, job, early outcome)."""
    import shlex

    jid = job_id_of(d)
    if ctx.dry_run:
        return jid, None, Outcome("skipped", output="dry-run: nothing run", command=shlex.join(argv),
                                  details={"job_id": jid})
    try:
        job = current_job(_runner(ctx), jid)
    except SourceError as exc:
        text = str(exc).lower()
        kind = "Slurm controller unreachable" if any(m in text for m in _UNREACHABLE_MARKERS) else "re-check failed"
        return jid, None, Outcome("failed", error=f"{kind}: {exc}", command=shlex.join(argv), details={"job_id": jid})
    if job is None:
        return jid, None, Outcome("succeeded", output=GONE, command=shlex.join(argv),
                                  details={"job_id": jid, "already_gone": True})
    changed = identity_mismatch(d, job)
    if changed:
        return jid, None, Outcome("skipped", error=f"target changed, not acted on: {changed}", command=shlex.join(argv),
                                  details={"job_id": jid, "identity": changed})
    return jid, job, None


def identity_mismatch(d: Decision, job: Job) -> str | None:
    """Return how the job Slurm lists now differs from the one decided about, or None when it is the same.

    The same id is not enough: ids are reused (a new controller, a simulated id, a requeue), so
    the owner, the name and the start time the decision recorded must match too.
    """
    ev = d.evidence
    recorded_start = ev.get("job_start_ts")
    if d.user and job.user and d.user != job.user:
        return f"job {job.job_id} belongs to {job.user}, the decision was about {d.user}'s job"
    name = ev.get("job_name")
    if name and job.name and name != job.name:
        return f"job {job.job_id} is named {job.name!r}, the decision was about {name!r}"
    if recorded_start is not None and job.start_ts is not None and abs(float(recorded_start) - job.start_ts) > 1.0:
        return (f"job {job.job_id} started at {job.start_ts:.0f}, the decision was about a job started at "
                f"{float(recorded_start):.0f}")
    if recorded_start is not None and job.start_ts is None and not job.pending:
        return f"job {job.job_id} shows no start time, the decision was about a job started at {float(recorded_start):.0f}"
    return None


#: Slurm's own "not now, try again" answers: right after a controller restart, before slurmdbd has
#: given a running job its database index, ``scontrol update`` answers "Job update not available
#: right now, the DB index is being set, try again in a bit". The command did nothing: it is asked
#: again after each of these pauses (15 s in all), then its answer stands.
_TRY_AGAIN_MARKERS = ("try again",)
_TRY_AGAIN_PAUSES = (1.0, 2.0, 4.0, 8.0)


def _run(ctx: ActionContext, argv: Sequence[str]) -> Completed:
    res = _runner(ctx).run(list(argv), timeout=30.0)
    logger.info("%s → rc %s %s", res.command, res.rc, res.stderr.strip()[:200])
    for pause in _TRY_AGAIN_PAUSES:
        if res.ok or not any(m in f"{res.stderr} {res.stdout}".lower() for m in _TRY_AGAIN_MARKERS):
            break
        _sleep(ctx, pause)
        res = _runner(ctx).run(list(argv), timeout=30.0)
        logger.info("%s (asked again after %gs, as Slurm said) → rc %s %s", res.command, pause, res.rc,
                    res.stderr.strip()[:200])
    return res


# -- executors ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DemoteConfig:
    """How ``demote`` lowers a job: a nice value, and/or a move to a preemptible QOS or partition."""

    nice: Annotated[int, Range(0, 2_147_483_645)] = 10000
    qos: str | None = None
    partition: str | None = None


def check_demote(cfg: DemoteConfig, policy: Policy) -> None:
    """Refuse settings that would make a demote rung of an enabled rule change nothing."""
    if cfg.nice or cfg.qos or cfg.partition:
        return
    for name in registry.rules():
        rule = policy.rule(name)
        if rule.enabled and any(r.action == "demote" for r in rule.ladder):
            raise Invalid("", f"rules.{name}.ladder has a demote rung but demote sets no nice, qos or "
                              "partition: the rung would change nothing")


@register(ActionSpec(
    "demote", rank=4, title="lower the job's priority", verb="demote", targets=("job", "user"),
    category=("demotions", "Demotions"), destructive=True, ladder=True, form=True,
    config=DemoteConfig, check=check_demote,
    doc="Lower a running job's priority (``scontrol update jobid=<id> nice=<n>``, and a preemptible "
        "``qos`` / ``partition`` when ``demote:`` names one); the job keeps running.",
    example="""
        ladder:
          - {action: notify}
          - {action: demote, after: 1h}
    """,
))
def demote(d: Decision, ctx: ActionContext) -> Outcome:
    """Lower a job: ``scontrol update jobid=<id> nice=<n>`` (and ``qos=`` / ``partition=`` when configured).

    YAML::

        demote: {nice: 10000, qos: preemptible, partition: null}
    """
    cfg: DemoteConfig = ctx.policy.actions["demote"]
    jid = job_id_of(d)
    argv = ["scontrol", "update", f"jobid={jid}", f"nice={int(cfg.nice)}"]
    if cfg.qos:
        argv.append(f"qos={cfg.qos}")
    if cfg.partition:
        argv.append(f"partition={cfg.partition}")
    jid, _job, early = _precheck(d, ctx, argv)
    if early:
        return early
    return _outcome(_run(ctx, argv), jid, "demote", {"nice": int(cfg.nice), "qos": cfg.qos, "partition": cfg.partition})


@register(ActionSpec(
    "hold", rank=5, title="hold the job", verb="hold", targets=("job",),
    category=("holds", "Holds / requeues"), destructive=True, ladder=True,
    doc="Hold a pending job (``scontrol hold <id>``) so it does not start.",
    example="""
        ladder:
          - {action: notify}
          - {action: hold, after: 30m}
    """,
))
def hold(d: Decision, ctx: ActionContext) -> Outcome:
    """Hold a pending job: ``scontrol hold <id>``."""
    argv = ["scontrol", "hold", job_id_of(d)]
    jid, _job, early = _precheck(d, ctx, argv)
    if early:
        return early
    return _outcome(_run(ctx, argv), jid, "hold")


@register(ActionSpec(
    "requeue", rank=6, title="requeue the job", verb="requeue", targets=("job",),
    category=("holds", "Holds / requeues"), destructive=True, ladder=True,
    doc="Put a job back in the queue (``scontrol requeue <id>``; the job must be requeueable).",
    example="""
        ladder:
          - {action: notify}
          - {action: requeue, after: 1h}
    """,
))
def requeue(d: Decision, ctx: ActionContext) -> Outcome:
    """Requeue a job: ``scontrol requeue <id>`` (the job must be requeueable)."""
    argv = ["scontrol", "requeue", job_id_of(d)]
    jid, _job, early = _precheck(d, ctx, argv)
    if early:
        return early
    return _outcome(_run(ctx, argv), jid, "requeue")


def _signal_argv(job: Job | None, jid: str, signal: str) -> list[str]:
    # a pending job has no process to signal (scancel --signal waits on it): cancel it plainly
    if job is not None and job.pending:
        return ["scancel", jid]
    return ["scancel", f"--signal={signal}", "--full", jid]


def _signal(d: Decision, ctx: ActionContext, signal: str, action: str) -> Outcome:
    jid, job, early = _precheck(d, ctx, _signal_argv(None, job_id_of(d), signal))
    if early:
        return early
    return _outcome(_run(ctx, _signal_argv(job, jid, signal)), jid, action, {"signal": signal})


@register(ActionSpec(
    "terminate", rank=7, title="cancel the job (SIGTERM, then SIGKILL after a grace period)", verb="terminate",
    targets=("job",), category=("cancels", "Jobs cancelled"), destructive=True, ends_job=True,
    frees_gpus=True, ladder=True, then=("kill", "cancel"),
    doc="Ask a job to end (``scancel --signal=TERM --full <id>``); only ``kill`` or ``cancel`` may follow it.",
    example="""
        ladder:
          - {action: notify}
          - {action: terminate, after: 1h}
          - {action: kill, after: 10m}
    """,
))
def terminate(d: Decision, ctx: ActionContext) -> Outcome:
    """Ask a job to end: ``scancel --signal=TERM --full <id>`` (the batch shell and every step)."""
    return _signal(d, ctx, "TERM", "terminate")


@register(ActionSpec(
    "kill", rank=8, title="kill the job (SIGKILL)", verb="kill", targets=("job",),
    category=("cancels", "Jobs cancelled"), destructive=True, ends_job=True, final=True, frees_gpus=True,
    ladder=True,
    doc="End a job now (``scancel --signal=KILL --full <id>``); the last rung of a ladder.",
    example="""
        ladder:
          - {action: terminate}
          - {action: kill, after: 10m}
    """,
))
def kill(d: Decision, ctx: ActionContext) -> Outcome:
    """End a job now: ``scancel --signal=KILL --full <id>``."""
    return _signal(d, ctx, "KILL", "kill")


@register(ActionSpec(
    "cancel", rank=9, title="cancel the job", verb="cancel", targets=("job", "user"),
    category=("cancels", "Jobs cancelled"), destructive=True, ends_job=True, final=True, frees_gpus=True,
    ladder=True, form=True,
    doc="The TERM → grace → KILL ladder in one action: SIGTERM, wait the grace period, SIGKILL if the job is "
        "still there.",
    example="""
        ladder:
          - {action: notify}
          - {action: cancel, after: 2h}
    """,
))
def cancel(d: Decision, ctx: ActionContext) -> Outcome:
    """The ladder in one action: TERM, wait the grace period, check, KILL if still there.

    The grace is ``ctx.extra["grace_s"]`` (default 60 s); the job is checked every few seconds
    during it, so one that exits on TERM ends the wait early.
    """
    jid = job_id_of(d)
    import shlex

    plan = f"{shlex.join(_signal_argv(None, jid, 'TERM'))}; (grace); {shlex.join(_signal_argv(None, jid, 'KILL'))}"
    jid, job, early = _precheck(d, ctx, _signal_argv(None, jid, "TERM"))
    if early:
        if early.status == "skipped":
            return Outcome("skipped", output=early.output, error=early.error, command=plan, details=early.details)
        return early
    runner = _runner(ctx)
    first = _run(ctx, _signal_argv(job, jid, "TERM"))
    out = _outcome(first, jid, "cancel (TERM)", {"signal": "TERM"})
    if out.status == "failed" or out.details.get("already_gone") or (job is not None and job.pending):
        return out
    grace = float(ctx.extra.get("grace_s", DEFAULT_GRACE_S))
    waited = 0.0
    step = min(2.0, max(grace, 0.1))
    while waited < grace:
        _sleep(ctx, min(step, grace - waited))
        waited += min(step, grace - waited)
        if _gone(runner, jid):
            return Outcome("succeeded", output=f"gone after TERM ({waited:.0f}s of {grace:.0f}s grace)",
                           command=first.command, details={"job_id": jid, "signal": "TERM", "waited_s": waited})
    if _gone(runner, jid):
        return Outcome("succeeded", output="gone after TERM", command=first.command,
                       details={"job_id": jid, "signal": "TERM", "waited_s": waited})
    second = _run(ctx, _signal_argv(None, jid, "KILL"))
    out = _outcome(second, jid, "cancel (KILL)", {"signal": "KILL", "waited_s": waited})
    if out.status != "succeeded":
        return out
    for _ in range(20):
        if _gone(runner, jid):
            return Outcome("succeeded", output=f"gone after KILL (TERM ignored for {waited:.0f}s)",
                           command=f"{first.command}; {second.command}",
                           details={"job_id": jid, "signal": "KILL", "waited_s": waited})
        _sleep(ctx, 0.5)
    return Outcome("failed", error=f"job {jid} still listed after TERM and KILL", command=f"{first.command}; {second.command}",
                   details={"job_id": jid, "signal": "KILL"})


def _gone(runner: Runner, jid: str) -> bool:
    try:
        return current_job(runner, jid) is None
    except SourceError:
        return False
