"""Reservation actions: ``reserve`` nodes for a predicted peak, ``release_reservation`` when unused.

``reserve``              ``scontrol create reservation reservationname=<name> starttime=now+<m>minutes
                         duration=<minutes> nodecnt=<n> accounts=<a> [partitionname=<p>]``: the hourly
                         power run proposes it for an account whose forecast peak would not fit
                         (:mod:`gpu_cost.capacity.reservations`). A reservation of that name already there is
                         left alone (``skipped``: the agent did not make it, so it is not the agent's);
                         a peak already over is skipped.
``release_reservation``  give unused reserved nodes back (the agent's own reservations; someone else's
                         only where ``rules.idle_reservation.release_foreign`` names it and a human
                         approves, :func:`gpu_cost.decide.engine.guard`): ``scontrol delete reservationname=<name>``
                         when no job runs in it, else ``scontrol update reservationname=<name>
                         nodes=<the nodes its jobs hold>`` (shrink). A job waiting for it, or every
                         node in use, leaves it as it is (``skipped``).

Both re-read the reservation first (``scontrol show reservation <name>``): one gone counts as
released; one that is not the reservation decided about (another start time: the name was
reused) is not touched. Slurm operators may not manage reservations: the agent's Slurm user needs
``adminlevel=admin`` (``sacctmgr -i modify user gpucost set adminlevel=admin``) for these two, or
leave them out of the ladders. Dry-run runs nothing and returns ``skipped`` with the command.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Sequence

from gpu_cost.act.base import ActionContext, Outcome, register
from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import Decision, Reservation
from gpu_cost.core.registry import ActionSpec
from gpu_cost.perceive.runner import Runner


def name_of(d: Decision) -> str:
    """Return the reservation a decision targets (``reservation:<name>``)."""
    if d.target.startswith("reservation:"):
        return d.target[len("reservation:"):]
    raise ValueError(f"decision {d.decision_id} targets {d.target!r}, not a reservation")


def _runner(ctx: ActionContext) -> Runner:
    if ctx.slurm is not None:
        return ctx.slurm
    from gpu_cost.perceive.slurm import default_runner

    return default_runner()


def _source(ctx: ActionContext):  # type: ignore[no-untyped-def]
    from gpu_cost.perceive.slurm import SlurmSource

    return SlurmSource(_runner(ctx), timeout=30.0)


def _scontrol(ctx: ActionContext, argv: Sequence[str], name: str, what: str, done: str) -> Outcome:
    from gpu_cost.act.slurm import classify

    res = _runner(ctx).run(list(argv), timeout=30.0)
    msg = (res.stderr.strip() or res.stdout.strip())[:400]
    if res.ok:
        return Outcome("succeeded", output=done, command=res.command, details={"reservation": name})
    kind = classify(res)
    if kind == "denied":
        return Outcome("failed", error=f"permission denied ({what} {name}): {msg}", command=res.command)
    if kind == "unreachable":
        return Outcome("failed", error=f"Slurm controller unreachable ({what} {name}): {msg}", command=res.command)
    return Outcome("failed", error=f"{what} {name} failed (exit {res.rc}): {msg}", command=res.command)


def _current(ctx: ActionContext, name: str, cmd: str) -> Reservation | Outcome | None:
    try:
        found = _source(ctx).reservations(name)
    except SourceError as exc:
        return Outcome("failed", error=f"re-check of reservation {name} failed: {exc}", command=cmd)
    return next((r for r in found if r.name == name), None)


def create_argv(d: Decision, now: float) -> list[str] | None:
    """Return the ``scontrol create reservation`` command of a ``reserve`` decision at ``now``; None when
    the reserved time is already over."""
    ev = d.evidence
    start, end = float(ev["start_ts"]), float(ev["end_ts"])
    if end <= now + 60:
        return None
    wait_min = max(0, math.ceil((start - now) / 60.0))
    minutes = math.ceil((end - max(start, now)) / 60.0)
    argv = ["scontrol", "create", "reservation", f"reservationname={name_of(d)}",
            f"starttime=now+{wait_min}minutes" if wait_min else "starttime=now", f"duration={minutes}",
            f"nodecnt={int(ev['node_count'])}", f"accounts={','.join(ev['accounts'])}"]
    if ev.get("partition"):
        argv.append(f"partitionname={ev['partition']}")
    return argv


@register(ActionSpec(
    "reserve", rank=13, title="reserve nodes for a predicted peak", verb="reserve", targets=("reservation",),
    category=("reservations", "Reservations made"), destructive=True,
    doc="Create a Slurm reservation for an account ahead of its forecast peak (``scontrol create reservation``); "
        "the hourly power run proposes it under ``reservations:``, never a rule's ladder. Over "
        "``reservations.approval_over_nodes`` nodes a human approves it.",
    example="""
        reservations:
          enabled: true
          accounts: [vision, nlp]
          lead: 1h
          max_nodes: 4
          approval_over_nodes: 1
    """,
))
def reserve(d: Decision, ctx: ActionContext) -> Outcome:
    """Create the reservation a ``reserve`` decision describes, once."""
    name = name_of(d)
    argv = create_argv(d, time.time() if not ctx.dry_run else ctx.now)
    if argv is None:
        return Outcome("skipped", error=f"the peak {name} was made for is over: nothing reserved",
                       details={"reservation": name})
    cmd = shlex.join(argv)
    if ctx.dry_run:
        return Outcome("skipped", output="dry-run: nothing run", command=cmd, details={"reservation": name})
    current = _current(ctx, name, cmd)
    if isinstance(current, Outcome):
        return current
    if current is not None:
        # not made by this decision: a ``skipped`` reserve is no proof of ownership, so the
        # idle-reservation rule treats it as someone else's (gpu_cost.capacity.reservations.mark_own)
        return Outcome("skipped", error=f"reservation {name} already exists: not made by the agent, not touched",
                       command=cmd, details={"reservation": name, "noop": True})
    return _scontrol(ctx, argv, name, "create reservation",
                     f"reservation {name} created: {d.evidence['node_count']} node(s) for "
                     f"{','.join(d.evidence['accounts'])}")


@register(ActionSpec(
    "release_reservation", rank=14, title="release the reservation's unused nodes", verb="release",
    targets=("reservation",), category=("reservations_released", "Reservations released or shrunk"),
    destructive=True, ladder=True,
    doc="Give a reservation's unused nodes back: delete it when no job runs in it (``scontrol delete "
        "reservationname=<name>``), else shrink it to the nodes its jobs hold (``scontrol update "
        "reservationname=<name> nodes=<those>``); a job waiting for it leaves it as it is.",
    example="""
        rules:
          idle_reservation:
            ladder:
              - {action: notify}
              - {action: release_reservation, after: 2h}
    """,
))
def release_reservation(d: Decision, ctx: ActionContext) -> Outcome:
    """Delete or shrink an unused reservation after re-checking it and its jobs."""
    from gpu_cost.perceive.slurm import compress_hostlist

    name = name_of(d)
    delete = ["scontrol", "delete", f"reservationname={name}"]
    if ctx.dry_run:
        return Outcome("skipped", output="dry-run: nothing run (deleted when no job runs in it, else shrunk to "
                       "the nodes its jobs hold)", command=shlex.join(delete), details={"reservation": name})
    current = _current(ctx, name, shlex.join(delete))
    if isinstance(current, Outcome):
        return current
    if current is None:
        return Outcome("succeeded", output=f"reservation {name} already gone", command=shlex.join(delete),
                       details={"reservation": name, "already_gone": True})
    recorded = d.evidence.get("reservation_start_ts")
    if recorded is not None and abs(float(recorded) - current.start_ts) > 1.0:
        return Outcome("skipped", error=(f"target changed, not acted on: reservation {name} starts at "
                                         f"{current.start_ts:.0f}, the decision was about one starting at "
                                         f"{float(recorded):.0f}"), details={"reservation": name})
    try:
        jobs = [j for j in _source(ctx).jobs() if j.reservation == name]
    except SourceError as exc:
        return Outcome("failed", error=f"re-check of the jobs in {name} failed: {exc}", command=shlex.join(delete))
    if any(j.pending for j in jobs):
        return Outcome("skipped", error=f"job(s) {', '.join(j.job_id for j in jobs if j.pending)} wait for "
                       f"{name}: left as it is", details={"reservation": name})
    used = sorted({h for j in jobs if j.running for h in j.nodes} & set(current.nodes))
    if not used:
        return _scontrol(ctx, delete, name, "delete reservation",
                         f"reservation {name} released ({current.node_count} node(s))")
    if len(used) >= len(current.nodes):
        return Outcome("skipped", error=f"all {len(used)} node(s) of {name} run its jobs now: nothing to release",
                       details={"reservation": name})
    argv = ["scontrol", "update", f"reservationname={name}", f"nodes={compress_hostlist(used)}"]
    return _scontrol(ctx, argv, name, "shrink reservation",
                     f"reservation {name} shrunk from {len(current.nodes)} to {len(used)} node(s) ({', '.join(used)})")
