"""Power strategies played against a demand series: what each would have saved, and who waited.

``gpu-cost power replay --series S`` takes hourly GPU demand per key (``ts, key, value``: GPUs
running plus pending, a team's or a partition's) and gives each key a pool of nodes (by default
the fewest ``gpus_per_node``-GPU nodes that hold its peak). Three strategies run the same pools
over the same hours, side by side:

``slurm_reactive``  Slurm's own power saving: a node idle for ``SuspendTime`` is powered down, at
                    any hour; a job that needs it resumes it, and the job waits ``ResumeTimeout``
                    (the boot) for it.
``offhours``        the agent's hourly off-hours run (:func:`gpu_cost.offhours.plan_power`, the
                    policy as written, no forecast); Slurm resumes nodes for jobs as above.
``forecast``        the same run, given the demand forecast (refitted daily at ``refit_hour``, as
                    the nightly DAG does, on the hours before it only) and with
                    ``offhours.forecast_lulls`` on: it pre-warms nodes before predicted demand
                    and keeps nodes down through predicted lulls, sized by the forecast's 80 %
                    upper bound.

The decisions of the two agent strategies are the live ones: each hour the pool is shown to the
same ``plan_power`` the ``gpu_offhours_power`` DAG calls, as a snapshot of nodes (idle, allocated,
powered down with the agent's reason, booting), the pending demand as a pending job, and one GPU
row per node up (busy share of the last hour as its utilisation).

Within an hour the demand is the series' value (hourly means; the simulation steps every
``step_s``). Demand above the pool's GPUs queues whatever the strategy and is reported apart
(``gpu_hours_over_pool``); demand the pool could hold but that finds its nodes down or booting
*waited for a boot* (``gpu_hours_waited``, and ``max_wait_s``: the longest stretch during which
any demand waited). ``node_hours_off`` counts node-hours powered down (not booting), valued at
``offhours.idle_power_w`` per node and ``cost.kwh_usd``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpu_cost.errors import GpuCostError, TraceError
from gpu_cost.model import Job, Node, Snapshot

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from gpu_cost.policy.schema import Policy

logger = logging.getLogger(__name__)

HOUR = 3600.0
STRATEGIES = ("slurm_reactive", "offhours", "forecast")
#: what each strategy adds up to (summed over the keys)
FIGURES = ("node_hours_off", "kwh_saved", "usd_saved", "gpu_hours_waited", "max_wait_s", "boots", "power_downs")


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
    """

    gpus_per_node: int = 8
    nodes: int | None = None
    step_s: float = 300.0
    boot_s: float = 600.0
    suspend_time_s: float = 1800.0
    refit_hour: int = 2
    use_prophet: bool = False
    timezone: str | None = None


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
        nodes, rows = [], []
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
                rows.append({"host": n.name, "gpu": 0, "util_mean": busy, "util_max": 100.0 if recent else 0.0,
                             "mem_max_mib": 1024.0 if recent else 0.0, "power_w": math.nan, "stale": False})
            nodes.append(Node(name=n.name, state=state, gpus_total=self.g, gpus_alloc=n.alloc if state in
                              ("allocated", "mixed") else 0, partitions=(self.key,), reason=reason))
            n.busy_gpu_s = n.up_s = 0.0
        jobs: tuple[Job, ...] = ()
        if self.pending > 1e-9:
            jobs = (Job(job_id=f"{self.key}-demand", user="", state="PENDING", partition=self.key,
                        gpus_requested=math.ceil(self.pending)),)
        gpus = pd.DataFrame(rows, columns=["host", "gpu", "util_mean", "util_max", "mem_max_mib", "power_w", "stale"])
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
    """A key's forecasts, refitted daily on the hours before each refit; the newest one answers."""

    made: list[tuple[float, np.ndarray, np.ndarray]] = field(default_factory=list)  # (made at, hour ts, upper)
    refits: int = 0
    models: dict[str, int] = field(default_factory=dict)

    def peak_upper(self, t: float, horizon_s: float) -> float | None:
        """Return the most GPUs the newest forecast made by ``t`` allows (upper bound) in ``[t, t + horizon_s]``."""
        import numpy as np

        fc = next((f for f in reversed(self.made) if f[0] <= t), None)
        if fc is None:
            return None
        _, ts, upper = fc
        sel = (ts + HOUR > t) & (ts <= t + horizon_s)
        if not sel.any():
            return None
        return float(np.max(upper[sel]))


def _forecasts(ts: np.ndarray, v: np.ndarray, policy: Policy, settings: ReplaySettings) -> _Forecasts:
    import numpy as np

    from gpu_cost.forecast import demand, prophet_util

    out = _Forecasts()
    stats = prophet_util.FitStats()
    horizon_h = max(round(policy.forecast.horizon / HOUR), 24)
    first = ts[0] + demand.MIN_HISTORY_H * HOUR
    day0 = math.floor(first / 86400.0) * 86400.0 + settings.refit_hour * HOUR
    cut = day0 if day0 >= first else day0 + 86400.0
    while cut <= ts[-1]:
        n = int(np.searchsorted(ts, cut, side="left"))
        fc = demand.forecast(ts[:n], v[:n], horizon_h, stats=stats, use_prophet=settings.use_prophet)
        out.made.append((cut, np.asarray(fc.ts, dtype=float), np.asarray(fc.upper, dtype=float)))
        out.models[fc.model] = out.models.get(fc.model, 0) + 1
        out.refits += 1
        cut += 86400.0
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
                  settings: ReplaySettings, forecasts: _Forecasts | None) -> _Tally:
    from gpu_cost.offhours import lull_horizon, plan_power, wake_horizon

    pool = _Pool(key, nodes, settings.gpus_per_node, settings, float(grid[0]))
    steps = max(round(HOUR / settings.step_s), 1)
    cfg = policy.offhours
    for h, hour_ts in enumerate(grid):
        if name != "slurm_reactive" and h > 0:
            fg = lg = None
            if forecasts is not None:
                fg = forecasts.peak_upper(hour_ts, wake_horizon(cfg))
                lg = forecasts.peak_upper(hour_ts, lull_horizon(cfg))
            plan = plan_power(pool.snapshot(policy, hour_ts), policy, hour_ts, forecast_gpus=fg, lull_gpus=lg)
            pool.apply(plan, hour_ts)
        for k in range(steps):
            t = hour_ts + k * settings.step_s
            pool.step(t, float(v[h]))
            if name == "slurm_reactive":
                for n in pool.nodes:
                    if (not n.down and not n.alloc and n.idle_since is not None
                            and t + settings.step_s - n.idle_since >= settings.suspend_time_s):
                        pool.power_down(n, by_agent=False)
    return pool.tally


def replay(series: pd.DataFrame, policy: Policy, settings: ReplaySettings | None = None,
           progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Play the three strategies over every key of ``series``; return the figures per strategy and key."""
    import numpy as np

    settings = settings or ReplaySettings()
    if settings.gpus_per_node < 1:
        raise GpuCostError(f"--gpus-per-node {settings.gpus_per_node}: at least 1")
    if settings.nodes is not None and settings.nodes < 1:
        raise GpuCostError(f"--nodes {settings.nodes}: at least 1")
    if not 0 < settings.step_s <= HOUR or HOUR % settings.step_s:
        raise GpuCostError(f"--step {settings.step_s:g}s: must divide an hour")
    if series.empty:
        raise TraceError("power replay: the series file has no rows")
    if settings.timezone:
        from gpu_cost.offhours import zone

        policy = replace(policy, offhours=replace(policy.offhours, timezone=settings.timezone))
        zone(policy.offhours)  # an unknown zone is an error naming it
    lulls = replace(policy, offhours=replace(policy.offhours, forecast_lulls=True))
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
            row[name] = _figures(tally, policy)
        # the demand and what the pool cannot hold are the series' own, the same under every strategy
        row["gpu_hours_demand"] = round(float(np.sum(v)), 1)
        row["gpu_hours_over_pool"] = round(float(np.sum(np.clip(v - nodes * settings.gpus_per_node, 0, None))), 1)
        row["node_hours"] = nodes * len(grid)
        per_key[key] = row
        if progress is not None:
            progress(key)
    out: dict[str, Any] = {"strategies": {name: _total([r[name] for r in per_key.values()]) for name in STRATEGIES}}
    out["keys"] = per_key
    out["node_hours"] = sum(r["node_hours"] for r in per_key.values())
    out["gpu_hours_demand"] = round(sum(r["gpu_hours_demand"] for r in per_key.values()), 1)
    out["gpu_hours_over_pool"] = round(sum(r["gpu_hours_over_pool"] for r in per_key.values()), 1)
    out["settings"] = {"gpus_per_node": settings.gpus_per_node, "nodes": settings.nodes, "step_s": settings.step_s,
                       "boot_s": settings.boot_s, "suspend_time_s": settings.suspend_time_s,
                       "refit_hour": settings.refit_hour, "use_prophet": settings.use_prophet,
                       "timezone": policy.offhours.timezone, "idle_power_w": policy.offhours.idle_power_w,
                       "kwh_usd": policy.cost.kwh_usd, "currency": policy.cost.currency, "policy": policy.source}
    base = out["strategies"]["slurm_reactive"]
    fc = out["strategies"]["forecast"]
    out["comparison"] = {
        "forecast_vs_reactive_node_hours": _ratio(fc["node_hours_off"], base["node_hours_off"]),
        "forecast_vs_reactive_waited": _ratio(fc["gpu_hours_waited"], base["gpu_hours_waited"]),
    }
    out["verdict"] = verdict(out)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _figures(t: _Tally, policy: Policy) -> dict[str, Any]:
    kwh = t.node_hours_off * policy.offhours.idle_power_w / 1000.0
    return {"node_hours_off": round(t.node_hours_off, 2), "kwh_saved": round(kwh, 1),
            "usd_saved": round(kwh * policy.cost.kwh_usd, 2), "gpu_hours_waited": round(t.gpu_hours_waited, 2),
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
    """Say in one line whether forecasting beat Slurm's reactive saving (node-hours at least as many,
    at least 30 % fewer GPU-hours waiting for boots), and where it did not."""
    base, fc = out["strategies"]["slurm_reactive"], out["strategies"]["forecast"]
    saves = fc["node_hours_off"] >= base["node_hours_off"]
    waits = fc["gpu_hours_waited"] <= 0.7 * base["gpu_hours_waited"] if base["gpu_hours_waited"] else \
        fc["gpu_hours_waited"] == 0
    parts = [f"forecast {fc['node_hours_off']:g} node-hours off vs reactive {base['node_hours_off']:g}",
             f"{fc['gpu_hours_waited']:g} vs {base['gpu_hours_waited']:g} GPU-hours waiting for a boot"]
    if saves and waits:
        return "forecast beats reactive: " + "; ".join(parts)
    why = []
    if not saves:
        why.append("it powers down fewer node-hours")
    if not waits:
        why.append("it does not cut the waiting for boots by 30 %")
    return "forecast does not beat reactive (" + " and ".join(why) + "): " + "; ".join(parts)


def table(out: dict[str, Any]) -> str:
    """Return the three strategies side by side, then per key, for a terminal."""
    cur = out["settings"]["currency"]
    head = f"{'':<22}" + "".join(f"{s:>16}" for s in STRATEGIES)
    lines = [head]
    labels = {"node_hours_off": "node-hours off", "kwh_saved": "kWh saved", "usd_saved": f"{cur} saved",
              "gpu_hours_waited": "GPU-h waited (boot)", "max_wait_s": "longest wait (s)", "boots": "boots",
              "power_downs": "power-downs"}
    for k in FIGURES:
        lines.append(f"{labels[k]:<22}" + "".join(f"{out['strategies'][s][k]:>16g}" for s in STRATEGIES))
    lines.append("")
    lines.append(f"{'key':<12}{'nodes':>6}{'peak':>8}  " + "  ".join(f"{s + ' off / waited':>30}" for s in STRATEGIES))
    for key, r in out["keys"].items():
        cells = "  ".join(f"{r[s]['node_hours_off']:>18g} / {r[s]['gpu_hours_waited']:>9g}" for s in STRATEGIES)
        lines.append(f"{key:<12}{r['nodes']:>6}{r['peak_gpus']:>8g}  {cells}")
    return "\n".join(lines)
