"""Power strategies played against a demand series: what each would have saved, and who waited.

``gpu-cost power replay --series S`` takes hourly GPU demand per key (``ts, key, value``: GPUs
running plus pending, a team's or a partition's) and gives each key a pool of nodes (by default
the fewest ``gpus_per_node``-GPU nodes that hold its peak). Three strategies run the same pools
over the same hours, side by side:

``slurm_reactive``  Slurm's own power saving: a node idle for ``SuspendTime`` is powered down, at
                    any hour; a job that needs it resumes it, and the job waits ``ResumeTimeout``
                    (the boot) for it.
``offhours``        the agent's hourly off-hours run (:func:`gpu_cost.capacity.offhours.plan_power`, the
                    policy as written, no forecast); Slurm resumes nodes for jobs as above.
``forecast``        the same run, given the demand forecast (refitted daily at ``refit_hour``, as
                    the nightly DAG does, on the hours before it only) and with
                    ``offhours.forecast_lulls`` on: it powers idle nodes down at the first run of
                    a predicted lull, pre-warms nodes before predicted demand, and keeps a warm
                    buffer of the forecast plus the ``offhours.forecast_quantile`` of its own
                    errors at that hour of the day over the last week
                    (:mod:`gpu_cost.capacity.forecast.calibration`; its 80 % band until then).

Each is also a frontier: Slurm's over ``SuspendTime`` (:data:`SUSPEND_TIMES`), the agent's over
``offhours.forecast_quantile`` (:data:`QUANTILES`), and the oracle's (:func:`_oracle`: what
knowing the demand exactly would power down at each level of waiting). The verdict compares the
agent with Slurm's frontier at the agent's own waiting, key by key (:func:`at_waiting`).

The decisions of the two agent strategies are the live ones: each hour the pool is shown to the
same ``plan_power`` the ``gpu_offhours_power`` DAG calls, as a snapshot of nodes (idle, allocated,
powered down with the agent's reason, booting), the pending demand as a pending job, and one GPU
row per node up (busy share of the last hour as its utilisation).

Within an hour the demand is the series' value (hourly means; the simulation steps every
``step_s``). Demand above the pool's GPUs queues whatever the strategy and is reported apart
(``gpu_hours_over_pool``); demand the pool could hold but that finds its nodes down or booting
*waited for a boot* (``gpu_hours_waited``, and ``max_wait_s``: the longest stretch during which
any demand waited). ``node_hours_off`` counts node-hours powered down (not booting), valued at
the node type's idle draw (``offhours.node_types``, else ``offhours.idle_power_w``) less
``offhours.boot_kwh`` for every boot, at ``cost.kwh_usd``.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpu_cost.core.errors import GpuCostError, TraceError
from gpu_cost.core.model import Job, Node, Snapshot

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from gpu_cost.config.schema import Policy

logger = logging.getLogger(__name__)

HOUR = 3600.0
STRATEGIES = ("slurm_reactive", "offhours", "forecast")
#: what each strategy adds up to (summed over the keys)
FIGURES = ("node_hours_off", "kwh_saved", "kwh_idle_avoided", "kwh_boots", "usd_saved", "gpu_hours_waited",
           "max_wait_s", "boots", "power_downs")
#: Slurm's frontier: its reactive saving at these SuspendTimes (plus the one asked for)
SUSPEND_TIMES = (600.0, 1800.0, 3600.0, 7200.0, 4 * HOUR, 6 * HOUR, 12 * HOUR, 24 * HOUR, 48 * HOUR, 96 * HOUR,
                 192 * HOUR, 384 * HOUR)
#: the agent's frontier: the forecast strategy with ``offhours.forecast_quantile`` at these values (plus the policy's)
QUANTILES = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


@dataclass(frozen=True)
class ReplaySettings:
    """How the pools and Slurm behave in the replay.

    :param gpus_per_node: GPUs of every node.
    :param nodes: nodes per key (None: the fewest that hold the key's peak).
    :param step_s: simulation step.
    :param boot_s: a powered-down node's time to be usable once resumed (Slurm's ``ResumeTimeout``
        covers it).
    :param suspend_time_s: Slurm's ``SuspendTime`` for the reactive strategy.
    :param refit_hour: UTC hour at which the forecast is refitted each day (the nightly DAG: 02:00).
    :param use_prophet: fit Prophet among the forecast's members, as the nightly does (slow: about
        2 s per key and day); off, the other members.
    :param timezone: the off-hours windows' zone (None: the policy's ``offhours.timezone``).
    :param node_type: the nodes' GPU model, for their power figures (``offhours.node_types``; empty:
        the ``offhours`` defaults).
    :param suspend_times: the values of ``SuspendTime`` on Slurm's frontier.
    :param quantiles: the ``offhours.forecast_quantile`` values of the agent's frontier.
    :param frontiers: sweep both (off: the three default points and the oracle only).
    """

    gpus_per_node: int = 8
    nodes: int | None = None
    step_s: float = 300.0
    boot_s: float = 600.0
    suspend_time_s: float = 1800.0
    refit_hour: int = 2
    use_prophet: bool = False
    timezone: str | None = None
    node_type: str = ""
    suspend_times: tuple[float, ...] = SUSPEND_TIMES
    quantiles: tuple[float, ...] = QUANTILES
    frontiers: bool = True


@dataclass
class _Node:
    name: str
    down: bool = False
    by_agent: bool = False
    ready_at: float = 0.0
    alloc: int = 0
    idle_since: float | None = 0.0
    #: GPU-seconds busy, and seconds up, since the last hourly plan (its utilisation window)
    busy_gpu_s: float = 0.0
    up_s: float = 0.0
    #: the end of the last step it had work (its GPUs read busy in a window reaching back past it)
    busy_until: float = -math.inf


@dataclass
class _Tally:
    node_hours_off: float = 0.0
    gpu_hours_waited: float = 0.0
    max_wait_s: float = 0.0
    boots: int = 0
    power_downs: int = 0
    wait_run_s: float = 0.0
    plans_held: dict[str, int] = field(default_factory=dict)


class _Pool:
    """One key's nodes as a strategy runs them, step by step."""

    def __init__(self, key: str, nodes: int, gpus_per_node: int, settings: ReplaySettings, start: float) -> None:
        self.key, self.g, self.s = key, gpus_per_node, settings
        self.nodes = [_Node(f"{key}-n{i:03d}", idle_since=start) for i in range(nodes)]
        self.tally = _Tally()
        self.pending = 0.0

    @property
    def capacity(self) -> int:
        return len(self.nodes) * self.g

    def ready(self, t: float) -> list[_Node]:
        return [n for n in self.nodes if not n.down and n.ready_at <= t]

    def step(self, t: float, demand: float) -> None:
        """Serve ``demand`` GPUs from ``t`` for one step; Slurm resumes nodes for what does not fit."""
        dt = self.s.step_s
        want = min(demand, float(self.capacity))
        left = want
        for n in self.nodes:
            if n.down or n.ready_at > t:
                n.alloc = 0
                continue
            n.alloc = int(min(self.g, math.ceil(left))) if left > 0 else 0
            left -= n.alloc
            n.up_s += dt
            n.busy_gpu_s += n.alloc * dt
            if n.alloc:
                n.idle_since = None
                n.busy_until = t + dt
            elif n.idle_since is None:
                n.idle_since = t
        short = max(left, 0.0)
        self.pending = max(demand - (want - short), 0.0)
        if short > 1e-9:
            self.tally.gpu_hours_waited += short * dt / HOUR
            self.tally.wait_run_s += dt
            self.tally.max_wait_s = max(self.tally.max_wait_s, self.tally.wait_run_s)
            booting = sum(self.g for n in self.nodes if not n.down and n.ready_at > t + dt)
            for n in self.nodes:  # Slurm resumes what the waiting jobs need beyond the nodes already booting
                if booting >= short:
                    break
                if n.down:
                    self.resume(n, t)
                    booting += self.g
        else:
            self.tally.wait_run_s = 0.0
        self.tally.node_hours_off += sum(1 for n in self.nodes if n.down) * dt / HOUR

    def resume(self, n: _Node, t: float) -> None:
        n.down, n.by_agent, n.ready_at, n.idle_since = False, False, t + self.s.boot_s, t + self.s.boot_s
        self.tally.boots += 1

    def power_down(self, n: _Node, by_agent: bool) -> None:
        n.down, n.by_agent, n.alloc = True, by_agent, 0
        self.tally.power_downs += 1

    # -- what the agent's hourly run sees ---------------------------------------------------------
    def snapshot(self, policy: Policy, t: float) -> Snapshot:
        """Return the pool at ``t`` as the off-hours run would see it from Slurm and DCGM."""
        import pandas as pd

        cfg = policy.offhours
        nodes = []
        cols: dict[str, list[Any]] = {c: [] for c in ("host", "gpu", "util_mean", "util_max", "mem_max_mib", "power_w",
                                                       "stale")}
        for n in self.nodes:
            if n.down:
                state, reason = "idle~", (cfg.reason if n.by_agent else "")
            elif n.ready_at > t:
                state, reason = "idle#", ""
            else:
                state = "idle" if not n.alloc else ("allocated" if n.alloc >= self.g else "mixed")
                reason = ""
                busy = n.busy_gpu_s / max(n.up_s * self.g, 1e-9) * 100.0 if n.up_s else 0.0
                recent = n.busy_until > t - cfg.window
                for c, x in (("host", n.name), ("gpu", 0), ("util_mean", busy), ("util_max", 100.0 if recent else 0.0),
                             ("mem_max_mib", 1024.0 if recent else 0.0), ("power_w", math.nan), ("stale", False)):
                    cols[c].append(x)
            nodes.append(Node(name=n.name, state=state, gpus_total=self.g, gpus_alloc=n.alloc if state in
                              ("allocated", "mixed") else 0, partitions=(self.key,), reason=reason))
            n.busy_gpu_s = n.up_s = 0.0
        jobs: tuple[Job, ...] = ()
        if self.pending > 1e-9:
            jobs = (Job(job_id=f"{self.key}-demand", user="", state="PENDING", partition=self.key,
                        gpus_requested=math.ceil(self.pending)),)
        gpus = pd.DataFrame(cols)
        return Snapshot(ts=t, window_s=cfg.window, lookback_s=cfg.window, source="replay", gpus=gpus,
                        jobs=jobs, nodes=tuple(nodes))

    def apply(self, plan: Any, t: float) -> None:
        by_name = {n.name: n for n in self.nodes}
        for c in plan.up:
            n = by_name[c.node]
            if n.down:
                self.resume(n, t)
        for c in plan.down:
            n = by_name[c.node]
            if not n.down and not n.alloc:
                self.power_down(n, by_agent=True)
        for why in plan.held:
            head = why.split(":")[0].split(" (")[0]
            self.tally.plans_held[head] = self.tally.plans_held.get(head, 0) + 1


# -- forecasts as the nightly makes them ---------------------------------------------------------
@dataclass
class _Forecasts:
    """A key's forecasts, refitted daily on the hours before each refit; the newest one answers.

    ``err`` is the forecast's realised error per hour of the series (demand minus the forecast in
    force for that hour, NaN before the first forecast): what the agent calibrates its bound on.
    """

    made: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)  # made at, hour ts, yhat, upper
    refits: int = 0
    models: dict[str, int] = field(default_factory=dict)
    grid: np.ndarray | None = None
    err: np.ndarray | None = None
    _quantiles: dict[tuple[float, float], np.ndarray] = field(default_factory=dict)

    def peak(self, t: float, horizon_s: float, quantile: float | None = None) -> float | None:
        """Return the most GPUs the newest forecast made by ``t`` keeps room for in ``[t, t + horizon_s]``:
        its upper bound, calibrated on its errors before ``t`` at the same hour of the day (``quantile``)."""
        import numpy as np

        from gpu_cost.capacity.forecast.calibration import calibrated_upper, error_quantiles

        fc = next((f for f in reversed(self.made) if f[0] <= t), None)
        if fc is None:
            return None
        _, ts, yhat, upper = fc
        sel = (ts + HOUR > t) & (ts <= t + horizon_s)
        if not sel.any():
            return None
        bound = upper[sel]
        if quantile is not None and self.grid is not None and self.err is not None:
            qs = self._quantiles.get((t, quantile))
            if qs is None:
                lo = int(np.searchsorted(self.grid, t - 8 * 86400.0))
                hi = int(np.searchsorted(self.grid, t))
                qs = self._quantiles[(t, quantile)] = error_quantiles(self.grid[lo:hi], self.err[lo:hi], q=quantile,
                                                                      now=t)
            bound = calibrated_upper(ts[sel], yhat[sel], bound, qs)
        return float(np.max(bound))


def _forecasts(ts: np.ndarray, v: np.ndarray, policy: Policy, settings: ReplaySettings) -> _Forecasts:
    import numpy as np

    from gpu_cost.capacity.forecast import demand, prophet_util

    out = _Forecasts()
    stats = prophet_util.FitStats()
    horizon_h = max(round(policy.forecast.horizon / HOUR), 24)
    first = ts[0] + demand.MIN_HISTORY_H * HOUR
    day0 = math.floor(first / 86400.0) * 86400.0 + settings.refit_hour * HOUR
    cut = day0 if day0 >= first else day0 + 86400.0
    inforce = np.full(len(ts), np.nan)
    while cut <= ts[-1]:
        n = int(np.searchsorted(ts, cut, side="left"))
        fc = demand.forecast(ts[:n], v[:n], horizon_h, stats=stats, use_prophet=settings.use_prophet)
        fts, fy = np.asarray(fc.ts, dtype=float), np.asarray(fc.yhat, dtype=float)
        out.made.append((cut, fts, fy, np.asarray(fc.upper, dtype=float)))
        # the newest forecast is the one in force from its refit on, for the hours it covers
        idx = np.searchsorted(ts, fts)
        ok = (idx < len(ts)) & (fts >= cut)
        idx, fy_ok = idx[ok], fy[ok]
        match = ts[idx] == fts[ok]
        inforce[idx[match]] = fy_ok[match]
        out.models[fc.model] = out.models.get(fc.model, 0) + 1
        out.refits += 1
        cut += 86400.0
    out.grid, out.err = ts, v - inforce
    return out


# -- the replay ----------------------------------------------------------------------------------
def _hourly(g: pd.DataFrame, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Return a key's series on a whole-hour grid (missing hours: the last value seen, or 0)."""
    import numpy as np

    ts = (g["ts"].to_numpy(dtype=float) // HOUR) * HOUR
    v = g["value"].to_numpy(dtype=float)
    if np.any(v[~np.isnan(v)] < 0):
        raise TraceError(f"series {key}: negative demand")
    grid = np.arange(ts.min(), ts.max() + HOUR, HOUR)
    out = np.full(len(grid), np.nan)
    idx = ((ts - grid[0]) // HOUR).astype(int)
    out[idx] = v
    last = 0.0
    for i in range(len(out)):  # an hour with no row: demand as the hour before (what the pool last saw)
        if np.isnan(out[i]):
            out[i] = last
        last = out[i]
    return grid, out


def _run_strategy(name: str, key: str, grid: np.ndarray, v: np.ndarray, nodes: int, policy: Policy,
                  settings: ReplaySettings, forecasts: _Forecasts | None, suspend_time_s: float | None = None) -> _Tally:
    from gpu_cost.capacity.offhours import lull_horizon, plan_power, wake_horizon

    pool = _Pool(key, nodes, settings.gpus_per_node, settings, float(grid[0]))
    steps = max(round(HOUR / settings.step_s), 1)
    cfg = policy.offhours
    suspend = settings.suspend_time_s if suspend_time_s is None else suspend_time_s
    for h, hour_ts in enumerate(grid):
        if name != "slurm_reactive" and h > 0:
            fg = lg = None
            if forecasts is not None:
                fg = forecasts.peak(hour_ts, wake_horizon(cfg), cfg.forecast_quantile)
                lg = forecasts.peak(hour_ts, lull_horizon(cfg), cfg.forecast_quantile)
            plan = plan_power(pool.snapshot(policy, hour_ts), policy, hour_ts, forecast_gpus=fg, lull_gpus=lg)
            pool.apply(plan, hour_ts)
        for k in range(steps):
            t = hour_ts + k * settings.step_s
            pool.step(t, float(v[h]))
            if name == "slurm_reactive":
                for n in pool.nodes:
                    if (not n.down and not n.alloc and n.idle_since is not None
                            and t + settings.step_s - n.idle_since >= suspend):
                        pool.power_down(n, by_agent=False)
    return pool.tally


# -- the limit: a strategy that knows the future -------------------------------------------------
def _oracle(v: np.ndarray, nodes: int, gpus_per_node: int, boot_s: float) -> tuple[float, list[tuple[float, float]]]:
    """Return what knowing the demand exactly could power down in a pool: (node-hours off with no
    wait at all, and the further trades: (node-hours gained, GPU-hours waited) of each choice).

    Demand fills the nodes from the first (as the replay's pool does), so node ``i`` is needed
    in the hours whose demand is above ``i`` nodes' GPUs: its idle gaps are known in advance.
    Without waiting, a node goes down for a whole gap and is resumed ``boot_s`` before the demand
    returns (a gap shorter than the boot is no gain); a gap that runs to the end needs no boot.
    The one trade left is to resume at the demand instead: the gap's last ``boot_s`` (or the
    whole short gap) more off, for the GPUs the returning demand puts on the node waiting a boot.
    """
    import numpy as np

    g = float(gpus_per_node)
    want = np.minimum(v, nodes * g)
    boot_h = boot_s / HOUR
    base = 0.0
    trades: list[tuple[float, float]] = []
    for i in range(nodes):
        on_node = np.clip(want - i * g, 0.0, g)  # the GPUs demand puts on node i each hour
        busy = on_node > 1e-9
        h, n = 0, len(v)
        while h < n:
            if busy[h]:
                h += 1
                continue
            end = h
            while end < n and not busy[end]:
                end += 1
            gap = float(end - h)
            if end == n:
                base += gap
            else:
                base += max(gap - boot_h, 0.0)
                trades.append((min(gap, boot_h), float(on_node[end]) * boot_h))
            h = end
    return base, trades


def _hull(base: float, trades: list[tuple[float, float]], max_points: int = 24) -> list[dict[str, float]]:
    """Return the frontier of a set of trades: the best node-hours off at each waiting level
    (trades taken best ratio first), thinned to about ``max_points`` points."""
    order = sorted((t for t in trades if t[0] > 0), key=lambda t: -(t[0] / t[1]) if t[1] > 0 else -math.inf)
    pts = [(0.0, base)]
    off, wait = base, 0.0
    for gain, cost in order:
        off += gain
        wait += cost
        pts.append((wait, off))
    if len(pts) > max_points:
        step = (len(pts) - 1) / (max_points - 1)
        pts = [pts[round(i * step)] for i in range(max_points)]
    return [{"gpu_hours_waited": round(w, 2), "node_hours_off": round(o, 2)} for w, o in pts]


def at_waiting(points: list[dict[str, Any]], waited: float) -> float:
    """Return the most node-hours off a curve reaches at ``waited`` GPU-hours of waiting.

    The curve's points are joined by straight lines from (0 waited, 0 off) (power saving off); a
    point that saves no more than one waiting less is never the best setting and is passed over;
    past the point that waits most the curve is flat.
    """
    env: list[tuple[float, float]] = [(0.0, 0.0)]
    for w, o in sorted((float(p["gpu_hours_waited"]), float(p["node_hours_off"])) for p in points):
        if o <= env[-1][1]:
            continue
        if w <= env[-1][0]:
            env[-1] = (env[-1][0], o)
        else:
            env.append((w, o))
    if waited <= env[0][0]:
        return env[0][1]
    for (w0, o0), (w1, o1) in itertools.pairwise(env):
        if waited <= w1:
            return o0 + (o1 - o0) * (waited - w0) / (w1 - w0)
    return env[-1][1]


# -- the replay ----------------------------------------------------------------------------------
def replay(series: pd.DataFrame, policy: Policy, settings: ReplaySettings | None = None,
           progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Play the three strategies over every key of ``series``; return the figures per strategy and key,
    Slurm's frontier (its ``SuspendTime`` swept), the agent's (``offhours.forecast_quantile`` swept) and
    the oracle's, and how they compare at equal waiting."""
    import numpy as np

    settings = settings or ReplaySettings()
    if settings.gpus_per_node < 1:
        raise GpuCostError(f"--gpus-per-node {settings.gpus_per_node}: at least 1")
    if settings.nodes is not None and settings.nodes < 1:
        raise GpuCostError(f"--nodes {settings.nodes}: at least 1")
    if not 0 < settings.step_s <= HOUR or HOUR % settings.step_s:
        raise GpuCostError(f"--step {settings.step_s:g}s: must divide an hour")
    if any(x <= 0 for x in settings.suspend_times) or settings.suspend_time_s <= 0:
        raise GpuCostError("--suspend-time / --suspend-times: every SuspendTime must be positive")
    if any(not 0.5 <= q <= 1 for q in settings.quantiles):
        raise GpuCostError(f"--quantiles {','.join(f'{q:g}' for q in settings.quantiles)}: each between 0.5 and 1")
    if series.empty:
        raise TraceError("power replay: the series file has no rows")
    if settings.timezone:
        from gpu_cost.capacity.offhours import zone

        policy = replace(policy, offhours=replace(policy.offhours, timezone=settings.timezone))
        zone(policy.offhours)  # an unknown zone is an error naming it
    lulls = replace(policy, offhours=replace(policy.offhours, forecast_lulls=True))
    idle_w, boot_kwh = policy.offhours.node_power(settings.node_type)
    money = (idle_w, boot_kwh, policy.cost.kwh_usd)
    sweep_s = sorted(set(settings.suspend_times) | {settings.suspend_time_s}) if settings.frontiers else []
    sweep_q = sorted(set(settings.quantiles) | {policy.offhours.forecast_quantile}) if settings.frontiers else []
    t0 = time.perf_counter()
    per_key: dict[str, dict[str, Any]] = {}
    for key, g in series.groupby("key", sort=True):
        key = str(key)
        grid, v = _hourly(g.sort_values("ts"), key)
        peak = float(np.max(v)) if len(v) else 0.0
        nodes = settings.nodes or max(1, math.ceil(peak / settings.gpus_per_node))
        fcs = _forecasts(grid, v, policy, settings)
        row: dict[str, Any] = {"nodes": nodes, "hours": len(grid), "peak_gpus": round(peak, 2),
                               "forecast_refits": fcs.refits, "forecast_models": fcs.models}
        for name in STRATEGIES:
            tally = _run_strategy(name, key, grid, v, nodes, lulls if name == "forecast" else policy, settings,
                                  fcs if name == "forecast" else None)
            row[name] = _figures(tally, *money)
        slurm_curve = []
        for s in sweep_s:
            fig = row["slurm_reactive"] if s == settings.suspend_time_s else _figures(
                _run_strategy("slurm_reactive", key, grid, v, nodes, policy, settings, None, s), *money)
            slurm_curve.append({"suspend_time_s": s, **_point(fig)})
        agent_curve = []
        for q in sweep_q:
            knob = replace(lulls, offhours=replace(lulls.offhours, forecast_quantile=q))
            fig = row["forecast"] if q == policy.offhours.forecast_quantile else _figures(
                _run_strategy("forecast", key, grid, v, nodes, knob, settings, fcs), *money)
            agent_curve.append({"forecast_quantile": q, **_point(fig)})
        base, trades = _oracle(v, nodes, settings.gpus_per_node, settings.boot_s)
        row["oracle"] = _hull(base, trades)
        row["oracle_trades"] = (base, trades)  # pooled over the keys below, then dropped
        row["frontiers"] = {"slurm_reactive": slurm_curve, "forecast": agent_curve}
        row["at_equal_waiting"] = _equal_waiting(row)
        # the demand and what the pool cannot hold are the series' own, the same under every strategy
        row["gpu_hours_demand"] = round(float(np.sum(v)), 1)
        row["gpu_hours_over_pool"] = round(float(np.sum(np.clip(v - nodes * settings.gpus_per_node, 0, None))), 1)
        row["node_hours"] = nodes * len(grid)
        per_key[key] = row
        if progress is not None:
            progress(key)
    out: dict[str, Any] = {"strategies": {name: _total([r[name] for r in per_key.values()]) for name in STRATEGIES}}
    pooled = [r.pop("oracle_trades") for r in per_key.values()]
    out["frontiers"] = {
        "slurm_reactive": [{"suspend_time_s": s, **_point(_total([_pick(r, "slurm_reactive", "suspend_time_s", s)
                                                                  for r in per_key.values()]))} for s in sweep_s],
        "forecast": [{"forecast_quantile": q, **_point(_total([_pick(r, "forecast", "forecast_quantile", q)
                                                               for r in per_key.values()]))} for q in sweep_q],
    }
    oracle = _hull(sum(b for b, _ in pooled), [t for _, ts in pooled for t in ts])
    for curve in out["frontiers"].values():
        for p in curve:
            p["share_of_oracle"] = _ratio(p["node_hours_off"], at_waiting(oracle, p["gpu_hours_waited"]))
    for p in out["frontiers"]["forecast"]:  # each setting of the knob against Slurm's frontier, key by key
        p.update(against_frontier({k: _pick(r, "forecast", "forecast_quantile", p["forecast_quantile"])
                                   for k, r in per_key.items()}, per_key))
    out["oracle"] = {"points": oracle, "zero_wait_node_hours": oracle[0]["node_hours_off"]}
    out["keys"] = per_key
    out["node_hours"] = sum(r["node_hours"] for r in per_key.values())
    out["gpu_hours_demand"] = round(sum(r["gpu_hours_demand"] for r in per_key.values()), 1)
    out["gpu_hours_over_pool"] = round(sum(r["gpu_hours_over_pool"] for r in per_key.values()), 1)
    out["settings"] = {"gpus_per_node": settings.gpus_per_node, "nodes": settings.nodes, "step_s": settings.step_s,
                       "boot_s": settings.boot_s, "suspend_time_s": settings.suspend_time_s,
                       "suspend_times": sweep_s, "forecast_quantiles": sweep_q,
                       "forecast_quantile": policy.offhours.forecast_quantile,
                       "refit_hour": settings.refit_hour, "use_prophet": settings.use_prophet,
                       "timezone": policy.offhours.timezone, "node_type": settings.node_type or "default",
                       "idle_power_w": idle_w, "boot_kwh": boot_kwh,
                       "kwh_usd": policy.cost.kwh_usd, "currency": policy.cost.currency, "policy": policy.source}
    out["comparison"] = _comparison(out)
    out["verdict"] = verdict(out)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _pick(row: dict[str, Any], curve: str, knob: str, value: float) -> dict[str, Any]:
    return next(p for p in row["frontiers"][curve] if p[knob] == value)


def _point(fig: dict[str, Any]) -> dict[str, Any]:
    return {k: fig[k] for k in FIGURES}


def _equal_waiting(row: dict[str, Any]) -> dict[str, Any]:
    """Return, for one key, Slurm's frontier and the oracle at the agent's waiting, and the ratios."""
    fc = row["forecast"]
    w = float(fc["gpu_hours_waited"])
    slurm = at_waiting(row["frontiers"]["slurm_reactive"], w)
    oracle = at_waiting(row["oracle"], w)
    return {"gpu_hours_waited": w, "slurm_frontier_node_hours": round(slurm, 2), "oracle_node_hours": round(oracle, 2),
            "forecast_over_frontier": _ratio(fc["node_hours_off"], slurm),
            "forecast_share_of_oracle": _ratio(fc["node_hours_off"], oracle)}


def against_frontier(points: dict[str, dict[str, Any]], keys: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Return how one strategy's points (one per key) compare with Slurm's frontier of each key at the
    point's own waiting: the frontier summed over the keys, the strategy's node-hours over it, and the
    keys where the strategy is under it."""
    frontier = {k: at_waiting(keys[k]["frontiers"]["slurm_reactive"], float(p["gpu_hours_waited"]))
                for k, p in points.items()}
    total = round(sum(frontier.values()), 2)
    return {"slurm_frontier_node_hours": total,
            "over_frontier": _ratio(sum(float(p["node_hours_off"]) for p in points.values()), total),
            "keys_below_frontier": sorted(k for k, p in points.items() if float(p["node_hours_off"]) < frontier[k] - 0.5)}


def _comparison(out: dict[str, Any]) -> dict[str, Any]:
    base, fc = out["strategies"]["slurm_reactive"], out["strategies"]["forecast"]
    eq = [r["at_equal_waiting"] for r in out["keys"].values()]
    vs = against_frontier({k: r["forecast"] for k, r in out["keys"].items()}, out["keys"])
    frontier = vs["slurm_frontier_node_hours"]
    oracle = round(sum(e["oracle_node_hours"] for e in eq), 2)
    two_h = next((p for p in out["frontiers"]["slurm_reactive"] if p["suspend_time_s"] == 7200.0), None)
    return {
        "forecast_vs_reactive_node_hours": _ratio(fc["node_hours_off"], base["node_hours_off"]),
        "forecast_vs_reactive_waited": _ratio(fc["gpu_hours_waited"], base["gpu_hours_waited"]),
        # summed over the keys, each at the agent's own waiting on that key
        "slurm_frontier_at_forecast_waiting": frontier,
        "forecast_over_frontier": _ratio(fc["node_hours_off"], frontier),
        "oracle_at_forecast_waiting": oracle,
        "forecast_share_of_oracle": _ratio(fc["node_hours_off"], oracle),
        "keys_below_frontier": vs["keys_below_frontier"],
        "reactive_2h_gpu_hours_waited": two_h["gpu_hours_waited"] if two_h else None,
    }


def _figures(t: _Tally, idle_w: float, boot_kwh: float, kwh_usd: float) -> dict[str, Any]:
    """Return a strategy's figures: energy saved is the idle draw of the node-hours off less what the boots cost."""
    idle_kwh = t.node_hours_off * idle_w / 1000.0
    boots_kwh = t.boots * boot_kwh
    kwh = idle_kwh - boots_kwh
    return {"node_hours_off": round(t.node_hours_off, 2), "kwh_saved": round(kwh, 1),
            "kwh_idle_avoided": round(idle_kwh, 1), "kwh_boots": round(boots_kwh, 1),
            "usd_saved": round(kwh * kwh_usd, 2), "gpu_hours_waited": round(t.gpu_hours_waited, 2),
            "max_wait_s": round(t.max_wait_s), "boots": t.boots, "power_downs": t.power_downs,
            "held": dict(sorted(t.plans_held.items()))}


def _total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in FIGURES:
        vals = [r[k] for r in rows]
        out[k] = max(vals, default=0) if k == "max_wait_s" else round(sum(vals), 2)
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def verdict(out: dict[str, Any]) -> str:
    """Say in one line how the agent's forecast compares with Slurm's best ``SuspendTime`` at the same
    waiting (Slurm's frontier, per key, at the agent's waiting there), and with the oracle."""
    c = out["comparison"]
    fc = out["strategies"]["forecast"]
    ahead = fc["node_hours_off"] - c["slurm_frontier_at_forecast_waiting"]
    share = c["forecast_share_of_oracle"]
    head = (f"forecast {fc['node_hours_off']:g} node-hours off at {fc['gpu_hours_waited']:g} GPU-hours waiting for "
            f"boots; Slurm's best SuspendTime at that waiting {c['slurm_frontier_at_forecast_waiting']:g}")
    tail = (f"; the oracle {c['oracle_at_forecast_waiting']:g} (forecast reaches "
            f"{'n/a' if share is None else f'{share:.0%}'} of it)")
    below = c["keys_below_frontier"]
    where = f"; below Slurm's frontier on {', '.join(below)}" if below else "; at or above it on every key"
    if ahead >= 0:
        ratio = c["forecast_over_frontier"]
        gain = f" (+{ratio - 1:.0%})" if ratio else ""
        return f"forecast beats Slurm's frontier{gain}: {head}{tail}{where}"
    return f"forecast is below Slurm's frontier: {head}{tail}{where}"


def table(out: dict[str, Any]) -> str:
    """Return the three strategies side by side, the frontiers, then per key, for a terminal."""
    cur = out["settings"]["currency"]
    head = f"{'':<24}" + "".join(f"{s:>16}" for s in STRATEGIES)
    lines = [head]
    labels = {"node_hours_off": "node-hours off", "gpu_hours_waited": "GPU-h waited (boot)",
              "kwh_saved": "kWh saved (net)", "kwh_boots": "  of which boots cost", "usd_saved": f"{cur} saved",
              "max_wait_s": "longest wait (s)", "boots": "boots", "power_downs": "power-downs"}
    for k, label in labels.items():
        vals = [out["strategies"][s][k] for s in STRATEGIES]
        lines.append(f"{label:<24}" + "".join(f"{x:>16g}" for x in vals))
    fr = out["frontiers"]
    if fr["slurm_reactive"]:
        lines += ["", "frontiers: node-hours off / GPU-hours waited (share of the oracle at that waiting)"]
        for p in fr["slurm_reactive"]:
            lines.append(f"  slurm SuspendTime {_dur(p['suspend_time_s']):>5}  {p['node_hours_off']:>10g} / "
                         f"{p['gpu_hours_waited']:<8g} kWh {p['kwh_saved']:>9g}  ({_pct(p['share_of_oracle'])})")
        for p in fr["forecast"]:
            below = p.get("keys_below_frontier") or []
            lines.append(f"  forecast quantile {p['forecast_quantile']:>5g}  {p['node_hours_off']:>10g} / "
                         f"{p['gpu_hours_waited']:<8g} kWh {p['kwh_saved']:>9g}  ({_pct(p['share_of_oracle'])}; "
                         f"{_times(p.get('over_frontier'))} Slurm's frontier, "
                         f"{'under it on ' + ', '.join(below) if below else 'at or above it on every key'})")
        for p in out["oracle"]["points"][:: max(1, len(out["oracle"]["points"]) // 6)]:
            lines.append(f"  oracle {'':>17}{p['node_hours_off']:>10g} / {p['gpu_hours_waited']:<8g}")
    lines.append("")
    lines.append(f"{'key':<10}{'nodes':>6}{'peak':>8}  " + "  ".join(f"{s + ' off / waited':>28}" for s in STRATEGIES)
                 + f"  {'slurm frontier':>14}{'oracle':>10}")
    for key, r in out["keys"].items():
        cells = "  ".join(f"{r[s]['node_hours_off']:>17g} / {r[s]['gpu_hours_waited']:>8g}" for s in STRATEGIES)
        eq = r["at_equal_waiting"]
        lines.append(f"{key:<10}{r['nodes']:>6}{r['peak_gpus']:>8g}  {cells}  "
                     f"{eq['slurm_frontier_node_hours']:>14g}{eq['oracle_node_hours']:>10g}")
    return "\n".join(lines)


def _dur(s: float) -> str:
    return f"{s / 3600:g}h" if s >= 3600 else f"{s / 60:g}m"


def _times(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def plot(out: dict[str, Any], path: str) -> str:
    """Draw the three curves (node-hours off against GPU-hours waited) and the default points into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    curves = (("slurm_reactive", "Slurm SuspendTime", "suspend_time_s", "tab:blue", "o"),
              ("forecast", "agent forecast (quantile)", "forecast_quantile", "tab:orange", "s"))
    for name, label, knob, colour, marker in curves:
        pts = sorted(out["frontiers"][name], key=lambda p: p["gpu_hours_waited"])
        if not pts:
            continue
        ax.plot([p["gpu_hours_waited"] for p in pts], [p["node_hours_off"] for p in pts], marker=marker,
                color=colour, label=label)
        for p in pts:
            text = _dur(p[knob]) if knob == "suspend_time_s" else f"{p[knob]:g}"
            ax.annotate(text, (p["gpu_hours_waited"], p["node_hours_off"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    orc = out["oracle"]["points"]
    ax.plot([p["gpu_hours_waited"] for p in orc], [p["node_hours_off"] for p in orc], color="tab:green",
            linestyle="--", label="oracle (knows the future)")
    for name, colour in (("slurm_reactive", "tab:blue"), ("forecast", "tab:orange"), ("offhours", "tab:gray")):
        p = out["strategies"][name]
        ax.scatter([p["gpu_hours_waited"]], [p["node_hours_off"]], s=120, marker="*", color=colour, zorder=5,
                   label=f"{name} (default)")
    ax.set_xlabel("GPU-hours waiting for a boot")
    ax.set_ylabel("node-hours powered down")
    ax.set_title("Power saving: node-hours off against waiting")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
