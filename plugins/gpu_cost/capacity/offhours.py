"""Off-hours power: which idle nodes to power down, which to bring back — pure functions, no I/O.

The ``gpu_offhours_power`` DAG calls :func:`plan_power` once an hour with a snapshot (GPUs, jobs,
processes, nodes) and gets a :class:`PowerPlan`:

*When.* Windows are wall-clock times in ``offhours.timezone`` (``zoneinfo``, so DST shifts are
followed: 22:00 stays 22:00 local). A window belongs to the day it starts; ``end`` before
``start`` wraps midnight; ``24:00`` is the end of the day.

*Whether.* Inside a window, nodes go down only if the cluster's GPU utilisation over
``offhours.window`` is under ``util_max``, no job of a high-priority partition/QOS is pending,
pending work fits in the GPUs left up, and the forecast demand for the next ``wake_lead`` fits
in the nodes that stay up. Degraded data (stale GPUs, missing metrics) never powers anything down.

*Which.* Only idle nodes (Slurm state ``idle`` with no flag, no GPU allocated, no running job, no
GPU process, every GPU seen idle over ``offhours.window``), never excluded nodes or partitions, never a node a protection
names (``match: {nodes: [gpu-a*]}``, any level: the hourly run asks no one, so ``approval`` too
keeps it up) nor one a protected job runs on or holds, always leaving a warm reserve of idle nodes
per partition, most power-hungry first, at most ``max_nodes_per_run``; more than
``approval_over_nodes`` need a human. Why a node stays up is in :attr:`PowerPlan.skipped`.

*Floor.* The last ``offhours.min_up`` healthy nodes of a partition (up and serving: not powered
down, booting, down, drained or failed) are never powered down, by the plan or by hand.

*Not back.* A node Slurm could not bring back from power saving (DOWN once ``ResumeTimeout``
passed) or that booted with GPUs missing (drained for a GRES count below its configuration) is
found from Slurm's own verdict (:func:`resume_failures`), reported in :attr:`PowerPlan.problems`,
never powered down or woken by the plan, and, passed in as ``failed`` by the caller from earlier
runs' records, left alone for ``offhours.failed_hold`` even once it is back.

*By hand.* :func:`vet_power_down` puts an operator's power-down request through the same
selection (idle, exclusions, protections, reserve, cap) without the window, utilisation and
demand conditions; a node an ``approval`` protection names goes through marked for a human.

*Waking.* Outside the windows every node the agent powered down (Slurm reason starting with
``offhours.reason``) comes back; inside, enough of them come back for pending jobs that do not fit
and for forecast demand within ``wake_lead``. Slurm also wakes nodes itself when a job needs them.

*Sized by the forecast.* With ``offhours.forecast_lulls`` and a forecast of the next
``lull_min`` (``lull_gpus``: its upper bound, the forecast plus the ``offhours.forecast_quantile``
of its own recent errors at that hour of the day, the demand it would take to be caught short),
every hour is planned as if inside a window, and the forecast takes the place of ``util_max``: idle nodes go down as long as the nodes left up hold ``lull_gpus``, and nodes
come back only as far as pending work or the forecast within ``wake_lead`` needs them. Without
a forecast the windows alone decide, as before.

The hourly run sees the forecast until the next run plus the wake lead
(:func:`wake_horizon`): a node woken at this run is up before demand that arrives before the next.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import functools
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpu_cost.config.schema import OffhoursConfig, Policy, Protection, Window
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.model import GpuColumns, Job, Node, Snapshot
from gpu_cost.decide.protections import job_protection, node_protection

logger = logging.getLogger(__name__)

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


# -- windows -----------------------------------------------------------------------------------
def _minutes(text: str, where: str) -> int:
    try:
        hh, mm = text.strip().split(":")
        h, m = int(hh), int(mm)
    except ValueError:
        raise PolicyError("policy", where, f"not a time of day (HH:MM): {text!r}") from None
    if not (0 <= h <= 24 and 0 <= m < 60) or (h == 24 and m):
        raise PolicyError("policy", where, f"not a time of day (00:00-24:00): {text!r}")
    return h * 60 + m


def zone(cfg: OffhoursConfig) -> ZoneInfo:
    try:
        return ZoneInfo(cfg.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise PolicyError("policy", "offhours.timezone", f"unknown time zone {cfg.timezone!r}") from None


def local_time(cfg: OffhoursConfig, now: float) -> dt.datetime:
    """Return ``now`` as wall-clock time in the policy's zone."""
    return dt.datetime.fromtimestamp(now, tz=zone(cfg))


def window_active(w: Window, local: dt.datetime, where: str = "offhours.windows") -> bool:
    """Return whether the wall-clock instant ``local`` falls inside window ``w``."""
    start, end = _minutes(w.start, f"{where}.start"), _minutes(w.end, f"{where}.end")
    minute = local.hour * 60 + local.minute
    today = _DAYS[local.weekday()]
    yesterday = _DAYS[(local.weekday() - 1) % 7]
    if end > start:
        return today in w.days and start <= minute < end
    if end == start:
        return False
    # wraps midnight: the part after start today, or the tail of yesterday's window
    return (today in w.days and minute >= start) or (yesterday in w.days and minute < end)


def in_window(cfg: OffhoursConfig, now: float) -> bool:
    """Return whether ``now`` is inside any off-hours window of the policy."""
    local = local_time(cfg, now)
    return any(window_active(w, local, f"offhours.windows[{i}]") for i, w in enumerate(cfg.windows))


# -- the plan ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeChoice:
    """One node the plan acts on (or keeps), with why."""

    node: str
    reason: str
    power_w: float = 0.0
    power_basis: str = ""
    gpus: int = 0
    partitions: tuple[str, ...] = ()
    #: the protection that lets the node go only with a human's approval (manual requests only)
    protection: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason, "power_w": round(self.power_w, 1),
                "power_basis": self.power_basis, "gpus": self.gpus, "partitions": list(self.partitions),
                "protection": self.protection}


@dataclass
class PowerPlan:
    """What the hourly run should do.

    :param down: nodes to power down (most power-hungry first, capped).
    :param up: nodes to power up (only nodes the agent powered down).
    :param held: reasons nothing (more) is powered down this run.
    """

    now: float
    in_window: bool
    local_time: str
    cluster_util: float | None
    down: list[NodeChoice] = field(default_factory=list)
    up: list[NodeChoice] = field(default_factory=list)
    reserve: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)
    needs_approval: bool = False
    pending_gpus: int = 0
    forecast_gpus: float | None = None
    #: the forecast's most GPUs over the lull horizon, when the forecast sizes the plan (forecast_lulls)
    lull_gpus: float | None = None
    powered_by_agent: list[str] = field(default_factory=list)
    capped: int = 0
    #: nodes that did not come back from power saving (now, or within ``offhours.failed_hold``), and why
    failed: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now, "in_window": self.in_window, "local_time": self.local_time,
            "cluster_util": None if self.cluster_util is None else round(self.cluster_util, 2),
            "down": [c.to_dict() for c in self.down], "up": [c.to_dict() for c in self.up],
            "reserve": list(self.reserve), "skipped": dict(self.skipped), "held": list(self.held),
            "needs_approval": self.needs_approval, "pending_gpus": self.pending_gpus,
            "forecast_gpus": self.forecast_gpus, "lull_gpus": self.lull_gpus,
            "powered_by_agent": list(self.powered_by_agent),
            "capped": self.capped, "idle_kw": round(sum(c.power_w for c in self.down) / 1000.0, 3),
            "failed": dict(self.failed), "problems": self.problems,
        }

    @property
    def problems(self) -> list[str]:
        """Return one line per node that did not come back from power saving (the run reports them)."""
        return [f"node {name} did not come back from power saving: {why}" for name, why in sorted(self.failed.items())]


def _powered_down(n: Node) -> bool:
    return n.state.endswith(("~", "%", "!"))


#: base states of a node that is up and can run jobs
_SERVING = ("idle", "mixed", "allocated", "completing")
_RESUME_FAILED = re.compile(r"resumetimeout|resume ?fail|boot ?fail", re.IGNORECASE)
_GPUS_MISSING = re.compile(r"gres/gpu\b.*\b(lower|count|missing|mismatch)", re.IGNORECASE)


def _healthy_up(n: Node) -> bool:
    """True when the node is up and serving: not powered down or booting, not down, drained or unresponsive."""
    base = n.state.rstrip("*~#%!@$-")
    return base in _SERVING and n.state == base


def resume_failures(nodes: Iterable[Node]) -> dict[str, str]:
    """Return the nodes that did not come back from power saving, with Slurm's word for why.

    Slurm marks a node whose ``ResumeProgram`` did not bring it back within ``ResumeTimeout``
    DOWN (reason ``ResumeTimeout reached``; a node still powering up shows ``#``, one powered down
    ``~``), and drains a node that boots with fewer GPUs than configured (reason ``gres/gpu count
    reported lower than configured``). Either is a node the next power-down must leave alone.
    """
    out: dict[str, str] = {}
    for n in nodes:
        if _healthy_up(n):
            continue
        base = n.state.rstrip("*~#%!@$-")
        reason = n.reason.strip()
        if _GPUS_MISSING.search(reason):
            out[n.name] = f"GPUs missing after boot: {n.state} ({reason})"
        elif _RESUME_FAILED.search(reason) or (base in ("down", "fail", "failing") and n.state.endswith(("~", "#"))):
            out[n.name] = f"failed to resume: {n.state} ({reason or 'no reason given'})"
    return out


def _powering_up(n: Node) -> bool:
    return n.state.endswith("#")


def by_agent(n: Node, cfg: OffhoursConfig) -> bool:
    """True when the node is powered down (or going down) with the agent's reason."""
    return (_powered_down(n) or _powering_up(n)) and bool(cfg.reason) and n.reason.startswith(cfg.reason)


def _excluded(n: Node, cfg: OffhoursConfig) -> str | None:
    for pat in cfg.exclude_nodes:
        if fnmatch.fnmatchcase(n.name, pat):
            return f"excluded by offhours.exclude_nodes ({pat})"
    for p in n.partitions:
        for pat in cfg.exclude_partitions:
            if fnmatch.fnmatchcase(p, pat):
                return f"partition {p} excluded by offhours.exclude_partitions"
    return None


def over_window(snapshot: Snapshot, cfg: OffhoursConfig) -> GpuColumns | None:
    """Return the snapshot's GPU columns over ``offhours.window``, what idle means to the plan (every source's snapshot
    aggregates it: :func:`gpu_cost.perceive.snapshot.rule_windows`); None when there are no GPU rows or a snapshot
    holds no aggregates for it: no GPU metrics, never another window's read as if they were."""
    if snapshot.gpus.empty:
        return None
    try:
        return snapshot.columns(cfg.window)
    except KeyError:
        logger.warning("the snapshot has no aggregates over offhours.window (%gs): no GPU metrics for the plan",
                       cfg.window)
        return None


def cluster_utilisation(snapshot: Snapshot, cfg: OffhoursConfig) -> float | None:
    """Return the mean GPU utilisation % of the cluster's fresh GPUs over ``offhours.window`` (None without data).

    GPUs outside the scheduler (attributed ``outside``: an inference server or a workstation the same Prometheus
    scrapes) are not the cluster's, as :meth:`~gpu_cost.core.model.Snapshot.gpu_count` does not count them: idle,
    they would lower the cluster's figure under ``offhours.util_max`` while its own GPUs are busy."""
    import numpy as np

    g = over_window(snapshot, cfg)
    if g is None:
        return None
    mine = ~g.get("stale", bool) & g.ours()
    if not mine.any():
        return None
    return float(np.nan_to_num(g.get("util_mean", float)[mine], nan=0.0).mean())


@dataclass(frozen=True)
class _GpuFacts:
    """What the GPU metrics say about one node over ``offhours.window`` (its rows of the snapshot, summarised)."""

    rows: int
    stale: bool
    util_max: float
    mem_max_mib: float
    #: the GPUs' draw over the sweep's primary window (the recent draw), summed
    power_w: float | None


def _gpu_facts(snapshot: Snapshot, cfg: OffhoursConfig) -> dict[str, _GpuFacts]:
    """Return the GPU rows summarised per host over ``offhours.window``, in one pass (a plan looks at every node)."""
    import numpy as np

    g = over_window(snapshot, cfg)
    if g is None:
        return {}
    n = len(g)

    def col(name: str, fill: float) -> list[float]:
        return np.nan_to_num(g.get(name, float), nan=fill).tolist() if name in g else [fill] * n

    stale = g.get("stale", bool).tolist() if "stale" in g else [False] * n
    util, mem = col("util_max", 100.0), col("mem_max_mib", 0.0)
    power = g.get("power_w", float).tolist() if "power_w" in g else [math.nan] * n
    acc: dict[str, list[Any]] = {}
    for host, st, u, m, pw in zip([str(h) for h in g.get("host", object).tolist()], stale, util, mem, power,
                                  strict=True):
        a = acc.get(host)
        if a is None:
            acc[host] = [1, st, u, m, None if math.isnan(pw) else pw]
            continue
        a[0] += 1
        a[1] = a[1] or st
        a[2] = max(a[2], u)
        a[3] = max(a[3], m)
        if not math.isnan(pw):
            a[4] = pw if a[4] is None else a[4] + pw
    return {h: _GpuFacts(int(a[0]), bool(a[1]), float(a[2]), float(a[3]), a[4]) for h, a in acc.items()}


def node_power(snapshot: Snapshot, node: Node, cfg: OffhoursConfig) -> tuple[float, str]:
    """Return (idle watts, basis): DCGM power of the node's GPUs, else the node's, else the policy's
    figure for its node type (``offhours.node_types``), else the policy default."""
    return _node_power(_gpu_facts(snapshot, cfg).get(node.name), node, cfg)


def _node_power(facts: _GpuFacts | None, node: Node, cfg: OffhoursConfig) -> tuple[float, str]:
    if facts is not None and facts.power_w is not None:
        return facts.power_w, "measured (DCGM GPU power)"
    if node.power_w is not None and node.power_w > 0:
        return float(node.power_w), "node power"
    model = node.gpu_model.lower()
    if model in cfg.node_types and cfg.node_types[model].idle_power_w is not None:
        return cfg.node_power(model)[0], f"policy offhours.node_types.{model}"
    return float(cfg.idle_power_w), "policy offhours.idle_power_w"


#: how often the ``gpu_offhours_power`` DAG plans (its schedule is hourly)
RUN_INTERVAL_S = 3600.0


def wake_horizon(cfg: OffhoursConfig) -> float:
    """Return how far ahead an hourly run must see demand: until the next run, plus the wake lead."""
    return RUN_INTERVAL_S + cfg.wake_lead


def lull_horizon(cfg: OffhoursConfig) -> float:
    """Return how far ahead a predicted lull must hold before a node goes down for it."""
    return max(cfg.lull_min, wake_horizon(cfg))


def plan_power(snapshot: Snapshot, policy: Policy, now: float, *, forecast_gpus: float | None = None,
               lull_gpus: float | None = None, failed: Mapping[str, str] | None = None) -> PowerPlan:
    """Return the power plan for ``now`` (see the module docstring).

    ``forecast_gpus`` is the most GPUs the demand forecast expects within :func:`wake_horizon`,
    ``lull_gpus`` within :func:`lull_horizon` (both the interval's upper bound; None: no forecast).
    ``failed`` names nodes seen failing to come back from power saving in earlier runs (within
    ``offhours.failed_hold``); with the ones failing now (:func:`resume_failures`) they are
    reported (:attr:`PowerPlan.problems`), never powered down or woken by the plan, and not
    counted among the healthy nodes ``offhours.min_up`` keeps.
    """
    cfg = policy.offhours
    by_forecast = cfg.enabled and cfg.forecast_lulls and lull_gpus is not None
    window = in_window(cfg, now) and cfg.enabled
    inside = window or by_forecast
    local = local_time(cfg, now)
    util = cluster_utilisation(snapshot, cfg)
    nodes = list(snapshot.nodes)
    plan = PowerPlan(now=now, in_window=window, local_time=local.isoformat(timespec="minutes"), cluster_util=util,
                     forecast_gpus=forecast_gpus, lull_gpus=lull_gpus if by_forecast else None)
    plan.failed = {**dict(failed or {}), **resume_failures(nodes)}
    mine = [n for n in nodes if by_agent(n, cfg) and n.name not in plan.failed]
    plan.powered_by_agent = [n.name for n in mine]
    pending = snapshot.pending_jobs()
    plan.pending_gpus = sum(max(j.gpus_requested, 0) for j in pending)

    up_nodes = [n for n in nodes if not _powered_down(n) and not n.state.startswith(("down", "drained"))]
    free_up = sum(max(n.gpus_total - n.gpus_alloc, 0) for n in up_nodes)
    total_up = sum(n.gpus_total for n in up_nodes)

    # -- waking ---------------------------------------------------------------------------------
    asleep = sorted((n for n in mine if _powered_down(n)), key=lambda n: n.name)
    if not inside:
        plan.up = [NodeChoice(n.name, "outside the off-hours window", gpus=n.gpus_total, partitions=n.partitions)
                   for n in asleep]
        plan.held.append("outside the off-hours window" if cfg.enabled else "offhours.enabled is false")
        return plan
    need = 0.0
    why = ""
    if cfg.wake_on_pending and plan.pending_gpus > free_up:
        need, why = float(plan.pending_gpus - free_up), f"pending jobs need {plan.pending_gpus} GPUs, {free_up} free"
    if forecast_gpus is not None and forecast_gpus > total_up:
        extra = forecast_gpus - total_up
        if extra > need:
            need, why = extra, (f"forecast demand {forecast_gpus:g} GPUs within {wake_horizon(cfg) / 60:.0f} min, "
                               f"{total_up} up")
    woken = 0.0
    for n in asleep:
        if woken >= need:
            break
        plan.up.append(NodeChoice(n.name, why, gpus=n.gpus_total, partitions=n.partitions))
        woken += n.gpus_total
    if plan.up:
        plan.held.append(f"waking {len(plan.up)} node(s): {why}")
        return plan

    # -- whether anything may go down --------------------------------------------------------------
    if snapshot.degraded:
        plan.held.append("degraded data: " + "; ".join(snapshot.problems)[:200])
    if util is None and cfg.require_gpu_metrics:
        plan.held.append("no fresh GPU metrics (offhours.require_gpu_metrics)")
    elif util is not None and util >= cfg.util_max and not by_forecast:
        plan.held.append(f"cluster GPU utilisation {util:.1f}% ≥ {cfg.util_max:g}%")
    hp = [j.job_id for j in pending if (j.partition in cfg.high_priority_partitions or j.qos in cfg.high_priority_qos)]
    if hp:
        plan.held.append(f"high-priority jobs pending: {', '.join(hp[:5])}")
    if plan.held:
        return plan

    # -- which -------------------------------------------------------------------------------------
    keep_for = max(forecast_gpus or 0.0, plan.lull_gpus or 0.0)
    if window:
        reason = f"idle in the off-hours window (cluster {util if util is not None else 0:.1f}%)"
    else:
        reason = (f"idle in a predicted lull (forecast at most {keep_for:g} GPUs over the next "
                  f"{lull_horizon(cfg) / 3600:g} h)")
    sel = _select(snapshot, policy, None, cap_gpus=(free_up - plan.pending_gpus, total_up - keep_for), reason=reason,
                  failed=plan.failed)
    plan.down, plan.reserve, plan.skipped, plan.capped = sel.chosen, sel.reserve, sel.skipped, sel.capped
    plan.needs_approval = len(sel.chosen) > cfg.approval_over_nodes
    return plan


def vet_power_down(snapshot: Snapshot, policy: Policy, now: float, names: Iterable[str], *,
                   override_protections: bool = False) -> tuple[list[NodeChoice], dict[str, str]]:
    """Return the requested nodes that may be powered down now, and why each other one may not.

    The manual power-down (``gpu_manual_reclaim``, ``target_kind=node``, ``action=power_down``)
    passes the same checks as the hourly plan, by the same code, except the time window, the
    cluster's utilisation and the demand (pending or forecast): the node is idle (Slurm state
    ``idle``, nothing allocated, no job or GPU process, its GPUs seen idle in fresh metrics), not in
    ``offhours.exclude_nodes`` / ``exclude_partitions``, no protection covers it or a job on it,
    every partition keeps its warm reserve, and at most ``offhours.max_nodes_per_run`` go (most
    power-hungry first). A protection of level ``approval`` naming the node lets it through with
    :attr:`NodeChoice.protection` set: the caller must ask a human. ``override_protections`` lets
    ``never`` / ``notify_only`` protections naming the node through the same way (the caller
    records the override and asks a second person); a protected *job* on the node always refuses it.

    Degraded data (``snapshot.problems``) refuses every node, as it holds the hourly plan. ``now``
    is the instant of the request (logged in the policy's zone; no window is checked). Example::

        chosen, refused = vet_power_down(snap, policy, now, ["gpu01", "gpu07"])
        for c in chosen:       # NodeChoice(node="gpu01", power_w=480.0, protection=None, ...)
            decide_power_down(c.node, needs_human=c.protection is not None)
        for node, why in refused.items():   # {"gpu07": "a job runs there"}
            logger.info("not powering %s down: %s", node, why)
    """
    wanted = list(dict.fromkeys(names))
    if snapshot.degraded:
        why = "degraded data, nothing powered down: " + "; ".join(snapshot.problems)[:200]
        return [], dict.fromkeys(wanted, why)
    known = {n.name for n in snapshot.nodes}
    sel = _select(snapshot, policy, set(wanted) & known, cap_gpus=None, override_protections=override_protections,
                  reason="manual power-down: idle, passes the off-hours checks",
                  failed=resume_failures(snapshot.nodes))
    refused = {name: "not in the current snapshot" for name in wanted if name not in known}
    chosen = {c.node for c in sel.chosen}
    for name in wanted:
        if name in known and name not in chosen:
            refused[name] = sel.skipped.get(name, "not idle")
    logger.info("manual power-down at %s: %s may go, refused %s", local_time(policy.offhours, now).isoformat(),
                [c.node for c in sel.chosen], refused)
    return sel.chosen, {name: refused[name] for name in wanted if name in refused}


@dataclass
class _Selection:
    chosen: list[NodeChoice] = field(default_factory=list)
    reserve: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    capped: int = 0


def _select(snapshot: Snapshot, policy: Policy, wanted: set[str] | None, *, cap_gpus: tuple[float, float] | None,
            reason: str, override_protections: bool = False,
            failed: Mapping[str, str] | None = None) -> _Selection:
    """Choose nodes to power down among ``wanted`` (None: every node): idle, allowed, reserve kept, capped.

    ``cap_gpus`` is (free GPUs left for pending work, GPUs left for forecast demand); None checks
    no demand. Without ``wanted`` (the hourly plan) a protection of any level keeps a node up;
    with it (a manual request) ``approval`` and overridden protections go through, marked.
    ``failed`` names nodes that did not come back from power saving (:func:`resume_failures`):
    never chosen, and not counted among a partition's healthy nodes (``offhours.min_up``).
    """
    cfg = policy.offhours
    failed = failed or {}
    nodes = list(snapshot.nodes)
    running = snapshot.running_jobs()
    busy_hosts = {h for j in running for h in j.nodes} | {h for j in running for h, _ in j.gpu_alloc}
    proc_hosts = {p.host for p in snapshot.processes}
    held = _jobs_by_host(snapshot)
    facts = _gpu_facts(snapshot, cfg)
    out = _Selection()
    candidates: list[tuple[Node, float, str, Protection | None]] = []
    idle_up: dict[str, list[str]] = {}
    healthy: dict[str, int] = {}
    for n in nodes:
        if n.name not in failed and _healthy_up(n):
            for p in n.partitions or ("",):
                healthy[p] = healthy.get(p, 0) + 1
        why_not = _why_not_idle(n, cfg, busy_hosts, proc_hosts, facts.get(n.name), policy)
        if why_not is None:
            # every idle node counts toward the reserve, excluded and protected ones too: they stay up
            for p in n.partitions or ("",):
                idle_up.setdefault(p, []).append(n.name)
        if wanted is not None and n.name not in wanted:
            continue
        if n.name in failed:
            out.skipped[n.name] = f"did not come back from power saving ({failed[n.name]}): not powered down again"
            continue
        blocked, mark = _protected(n, held.get(n.name, ()), policy, manual=wanted is not None,
                                   override=override_protections)
        if blocked:
            if wanted is not None or not _powered_down(n):
                out.skipped[n.name] = blocked
            continue
        if why_not is not None:
            if wanted is not None or not _powered_down(n):
                out.skipped[n.name] = why_not
            continue
        excl = _excluded(n, cfg)
        if excl:
            out.skipped[n.name] = excl
            continue
        watts, basis = _node_power(facts.get(n.name), n, cfg)
        candidates.append((n, watts, basis, mark))
    # most power-hungry first; the frugal ones stay up as the reserve
    candidates.sort(key=lambda c: (-c[1], c[0].name))
    partition_size: dict[str, int] = {}
    for n in nodes:
        for p in n.partitions or ("",):
            partition_size[p] = partition_size.get(p, 0) + 1
    reserve_need = {p: max(cfg.warm_reserve_nodes, math.ceil(cfg.warm_reserve_share * size))
                    for p, size in partition_size.items()}
    remaining_idle = {p: len(v) for p, v in idle_up.items()}
    cap_free, cap_total = cap_gpus if cap_gpus is not None else (math.inf, math.inf)
    for n, watts, basis, mark in candidates:
        parts = n.partitions or ("",)
        last = [p for p in parts if healthy.get(p, 0) - 1 < cfg.min_up]
        if last:
            out.reserve.append(n.name)
            out.skipped[n.name] = (f"kept up: one of the last {cfg.min_up} healthy node(s) of partition "
                                   f"{last[0] or '(none)'} (offhours.min_up)")
            continue
        short = [p for p in parts if remaining_idle.get(p, 0) - 1 < reserve_need.get(p, 0)]
        if short:
            out.reserve.append(n.name)
            out.skipped[n.name] = (f"kept up as the warm reserve of partition {short[0] or '(none)'} "
                                   f"({reserve_need.get(short[0], 0)} idle node(s))")
            continue
        if cap_free - n.gpus_total < 0 or cap_total - n.gpus_total < 0:
            out.reserve.append(n.name)
            out.skipped[n.name] = "kept up: pending or forecast demand needs its GPUs"
            continue
        if len(out.chosen) >= cfg.max_nodes_per_run:
            out.capped += 1
            out.skipped[n.name] = f"cap offhours.max_nodes_per_run={cfg.max_nodes_per_run} reached"
            continue
        for p in parts:
            remaining_idle[p] = remaining_idle.get(p, 0) - 1
            healthy[p] = healthy.get(p, 0) - 1
        cap_free -= n.gpus_total
        cap_total -= n.gpus_total
        why = reason
        if mark is not None:
            why += (f"; protection {mark.name!r} ({mark.level})"
                    + (": a human must approve" if mark.level == "approval" else " overridden: a second person must approve"))
        out.chosen.append(NodeChoice(n.name, why, power_w=watts, power_basis=basis, gpus=n.gpus_total,
                                     partitions=n.partitions, protection=None if mark is None else mark.name))
    return out


def _jobs_by_host(snapshot: Snapshot) -> dict[str, list[Job]]:
    """Return, per node, the jobs that run on it or hold it (pending jobs with nodes assigned)."""
    out: dict[str, list[Job]] = {}
    for j in snapshot.jobs:
        if j.running or j.pending:
            for h in dict.fromkeys((*j.nodes, *(h for h, _ in j.gpu_alloc))):
                out.setdefault(h, []).append(j)
    return out


def _node_protection(name: str, protections: tuple[Protection, ...]) -> Protection | None:
    """:func:`node_protection`, remembered: the hourly plan asks it for every node, every run."""
    try:
        return _node_protection_cached(name, protections)
    except TypeError:  # a protection that cannot be hashed (built in code, not from a policy file)
        return node_protection(name, protections)


@functools.lru_cache(maxsize=4096)
def _node_protection_cached(name: str, protections: tuple[Protection, ...]) -> Protection | None:
    return node_protection(name, protections)


def _protected(n: Node, jobs: Iterable[Job], policy: Policy, *, manual: bool,
               override: bool) -> tuple[str | None, Protection | None]:
    """Return (why the node may not go down, the protection that lets it go only with a human).

    Both are None when nothing protects the node.
    """
    for j in jobs:
        prot = job_protection(j, policy.protections)
        if prot is not None:
            return f"protected by {prot.name!r} ({prot.level}): job {j.job_id} runs there or holds it", None
    prot = _node_protection(n.name, policy.protections)
    if prot is None:
        return None, None
    if not manual:
        return (f"protected by {prot.name!r} ({prot.level}): the policy names this node, never powered down "
                "automatically"), None
    if prot.level == "approval" or override:
        return None, prot
    return f"protected by {prot.name!r} ({prot.level}): the policy names this node", None


def _why_not_idle(n: Node, cfg: OffhoursConfig, busy_hosts: set[str], proc_hosts: set[str],
                  facts: _GpuFacts | None, policy: Policy) -> str | None:
    if n.state != "idle":
        return f"state {n.state}"
    if n.gpus_alloc:
        return f"{n.gpus_alloc} GPU(s) allocated"
    if n.name in busy_hosts:
        return "a job runs there"
    if n.name in proc_hosts:
        return "a GPU process runs there"
    if facts is None or facts.rows == 0:
        return "no GPU metrics for the node" if cfg.require_gpu_metrics else None
    if facts.stale:
        return "stale GPU metrics"
    if facts.util_max >= policy.rules.idle_allocation.util_max:
        return "a GPU was busy in the window"
    if facts.mem_max_mib > policy.rules.zombie.mem_min_mib:
        return "GPU memory in use"
    return None


def hours_powered(nodes: Iterable[Node], cfg: OffhoursConfig) -> list[str]:
    """Return the names of nodes powered down by the agent (for the savings ledger)."""
    return [n.name for n in nodes if by_agent(n, cfg) and _powered_down(n)]


def savings_rows(nodes: Iterable[Node], power_w: Mapping[str, tuple[float, str]], cfg: OffhoursConfig,
                 kwh_usd: float, hour_start: float, hours: float = 1.0) -> list[dict[str, Any]]:
    """Return ``gpu_cost_savings`` rows (kind ``power``) for one hour of every node the agent keeps down."""
    out = []
    for name in hours_powered(nodes, cfg):
        watts, basis = power_w.get(name, (cfg.idle_power_w, "policy offhours.idle_power_w"))
        kwh = watts / 1000.0 * hours
        out.append({
            "saving_id": f"power:node:{name}:{int(hour_start)}", "decision_id": None, "ts": hour_start + hours * 3600.0,
            "kind": "power", "target": f"node:{name}", "user_name": None, "account": None, "gpu_model": "",
            "gpus": 0, "gpu_hours": 0.0, "kwh": round(kwh, 4), "usd": round(kwh * kwh_usd, 4),
            "basis": f"{hours:g} node-hour powered down x {watts:.0f} W idle ({basis})",
        })
    return out
