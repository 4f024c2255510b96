"""The live snapshot: Prometheus GPU aggregates + Slurm jobs and nodes + GPU processes over SSH.

``snapshot(policy, now)`` is what ``gpu_cost.loop.sweep.collect(policy, now, "prometheus")`` returns:

- GPUs: :class:`gpu_cost.perceive.prometheus.PrometheusSource` (a constant number of PromQL
  queries, aggregated in Prometheus), node CPU from node_exporter;
- jobs and nodes: :class:`gpu_cost.perceive.slurm.SlurmSource` (``squeue``/``scontrol`` JSON), or
  :class:`gpu_cost.perceive.slurmrestd.SlurmRestSource` when the ``gpu_cost_slurmrestd``
  connection is configured (same JSON over HTTP);
- GPU processes: :class:`gpu_cost.perceive.nodes.NodeSource`, only when the node SSH connection
  ``gpu_cost_node_ssh`` is configured; the same inspection checks each inspected node's GPU
  numbering (:mod:`gpu_cost.perceive.gpu_map`, also on the nodes of running jobs that look idle):
  a node whose Slurm, NVML, driver and metrics numberings disagree has its GPUs marked stale and
  is named in the problems (nothing destructive is decided);
- job logs (same condition, and ``evidence.job_log.enabled``): the tail of the StdOut/StdErr of
  the jobs :func:`log_candidates` picks, through the wrapper's read-only
  ``job-log`` verb, into ``Snapshot.job_logs``; a log that cannot be read is an ``error`` in its
  entry, never a problem of the snapshot (logs are extra evidence);
- joined by :func:`gpu_cost.perceive.correlate.attribute` (Slurm's GPU indices, the ``hpc_job`` label,
  process cgroups; disagreements are listed, not guessed away).

Slurm is read on a thread of its own while Prometheus answers: neither waits for the other.

A source that fails does not raise: its failure goes into ``Snapshot.problems``, which makes the
snapshot *degraded* (decisions from it are never destructive). Problems are redacted
(:func:`gpu_cost.core.redact.redact`): they end in the audit store, XCom and the health alert. ``check_fresh`` is the sweep's
sensor: Prometheus answers and its newest DCGM sample is within ``sweep.max_staleness``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gpu_cost.config.schema import Policy
from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import WINDOW_COLUMNS, GpuProcess, Job, Node, Reservation, Snapshot
from gpu_cost.core.redact import redact, redact_all

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

#: what the last snapshot cost, for logs and the bench: {"queries": n, "seconds": s}
LAST_STATS: dict[str, float] = {}


def _slurm_source(slurm: Any) -> Any:
    if slurm is not None and hasattr(slurm, "jobs"):
        return slurm
    from gpu_cost.perceive.slurm import SlurmSource

    if slurm is None:
        from gpu_cost.perceive.slurmrestd import default_source

        return default_source()
    return SlurmSource(runner=slurm)  # a Runner: local or on a login node


def _scheduler_names(frame: pd.DataFrame, node_stats: dict[str, dict[str, float]], jobs: Sequence[Job],
                     nodes: Sequence[Node]) -> tuple[pd.DataFrame, dict[str, dict[str, float]]]:
    """Read each host the exporters name otherwise than Slurm (``gpu01.cluster.example.org`` for ``gpu01``) under
    Slurm's name (:func:`gpu_cost.perceive.correlate.host_names`): the GPU series and node_exporter's alike."""
    from gpu_cost.perceive.correlate import host_names, scheduler_hosts

    if not len(frame) and not node_stats:
        return frame, node_stats
    known = scheduler_hosts(jobs, (n.name for n in nodes))
    gpu_hosts = host_names(frame["host"].astype(str).unique(), known) if len(frame) else {}
    if gpu_hosts:
        frame = frame.assign(host=frame["host"].astype(str).replace(gpu_hosts))
        logger.info("GPU series' hosts read under Slurm's names: %s",
                    ", ".join(f"{a} as {b}" for a, b in sorted(gpu_hosts.items())[:5]))
    stat_hosts = host_names(node_stats, known)
    if stat_hosts:
        node_stats = {stat_hosts.get(h, h): v for h, v in node_stats.items()}
    return frame, node_stats


def snapshot(policy: Policy, now: float, *, prometheus: Any = None, slurm: Any = None, node_source: Any = None,
             processes: bool | None = None, **_ignored: Any) -> Snapshot:
    """Return the snapshot of the real cluster at ``now`` (see the module docstring).

    :param prometheus: a :class:`~gpu_cost.perceive.prometheus.PrometheusSource` (default: from its connection).
    :param slurm: a ``SlurmSource`` or a runner for Slurm commands (default: local Slurm).
    :param node_source: a :class:`~gpu_cost.perceive.nodes.NodeSource` (default: from ``gpu_cost_node_ssh``).
    :param processes: read GPU processes over SSH (default: when the node connection is configured).
    """
    from gpu_cost.core.model import empty_gpu_frame
    from gpu_cost.perceive import nodes as nodes_mod
    from gpu_cost.perceive.correlate import attribute, sight_problems, unseen_nodes
    from gpu_cost.perceive.prometheus import PrometheusSource
    from gpu_cost.perceive.snapshot import rule_windows

    started = time.monotonic()
    problems: list[str] = []
    primary, others = rule_windows(policy)

    # jobs and nodes: read while Prometheus answers (the two sources do not depend on each other)
    def read_slurm() -> tuple[list[Job], list[Node], list[Reservation], list[str]]:
        jobs: list[Job] = []
        nodes: list[Node] = []
        resv: list[Reservation] = []
        try:
            src = _slurm_source(slurm)
            jobs = list(src.jobs())
            nodes = list(src.nodes())
        except SourceError as exc:
            return jobs, nodes, resv, [f"slurm: {exc}"]
        except ImportError as exc:
            return jobs, nodes, resv, [f"slurm: source not available: {exc}"]
        if policy.rules.idle_reservation.enabled:
            from gpu_cost.perceive.slurm import read_reservations

            resv = read_reservations(src)  # unread: no reservation is found idle, nothing else changes
        return jobs, nodes, resv, []

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-cost-slurm") as pool:
        slurm_read = pool.submit(read_slurm)

        # GPUs
        frame: pd.DataFrame = empty_gpu_frame()
        windows: dict[float, pd.DataFrame] = {}
        node_stats: dict[str, dict[str, float]] = {}
        prom = None
        try:
            prom = prometheus or PrometheusSource()
            frame, windows = prom.gpu_frame(policy, now)
        except SourceError as exc:
            problems.append(f"prometheus: {exc}")
            windows = {w: frame.iloc[:0][list(WINDOW_COLUMNS)] for w in others}
        if prom is not None and not any(p.startswith("prometheus:") for p in problems):
            try:
                node_stats = prom.node_stats(policy, now)
            except SourceError as exc:
                problems.append(f"node_exporter: {exc}")
        jobs, nodes, resv, slurm_problems = slurm_read.result()
    problems.extend(slurm_problems)
    frame, node_stats = _scheduler_names(frame, node_stats, jobs, nodes)

    # processes
    procs: list[GpuProcess] = []
    want = processes if processes is not None else (node_source is not None or nodes_mod.configured())
    ns = None
    maps: dict[str, Any] = {}
    seen_procs: list[GpuProcess] = []
    if want:
        try:
            ns = node_source or nodes_mod.NodeSource()
            hosts = suspect_hosts(frame, jobs, policy)
            if hasattr(ns, "inspect_many"):
                # the nodes a kill or a cancel could touch are inspected, and their GPU numbering checked
                found, node_problems = ns.inspect_many([*hosts, *idle_job_hosts(frame, jobs, policy, windows)])
                seen_procs = [p for i in found for p in i.processes]
                procs = [p for p in seen_procs if p.host in hosts]
                maps = {i.host: i.gpu_map for i in found}
            else:
                procs, node_problems = ns.processes(hosts)
            problems.extend(node_problems)
        except SourceError as exc:
            problems.append(f"node processes: {exc}")
    if maps:
        from gpu_cost.perceive import gpu_map

        checks = gpu_map.check_snapshot_nodes(maps, frame, jobs, nodes, seen_procs)
        frame, windows, map_problems = gpu_map.apply(frame, checks, windows)
        problems.extend(map_problems)

    unseen = unseen_nodes(frame["host"].astype(str), jobs, nodes) if len(frame) else []
    frame, disagreements = attribute(frame, jobs, procs, nodes, unseen=unseen)
    problems.extend(sight_problems(frame, unseen, live=True))
    if not len(frame) and not any(p.startswith("prometheus:") for p in problems):
        problems.append("prometheus: no GPU series (check the exporters and the connection's selector)")
    nodes = _merge_nodes(nodes, frame, node_stats)
    problems = redact_all(problems)  # a source's error may quote a URL with its credentials
    elapsed = time.monotonic() - started
    LAST_STATS.clear()
    LAST_STATS.update({"queries": float(prom.queries_made if prom is not None else 0), "seconds": elapsed})
    logger.info("live snapshot at %s: %d GPUs, %d jobs, %d processes, %d PromQL queries, %.2fs, problems=%s",
                now, len(frame), len(jobs), len(procs), prom.queries_made if prom is not None else 0, elapsed, problems)
    snap = Snapshot(ts=now, window_s=primary, lookback_s=policy.sweep.lookback, source="prometheus", gpus=frame,
                    jobs=tuple(jobs), processes=tuple(procs), nodes=tuple(nodes), problems=tuple(problems),
                    disagreements=tuple(disagreements), sample_interval_s=policy.sweep.sample_interval, windows=windows,
                    reservations=tuple(resv))
    if want and ns is not None and policy.evidence.job_log.enabled:
        try:
            snap.job_logs = ns.job_logs(log_candidates(snap, policy), policy.evidence.job_log.max_bytes)
        except Exception as exc:  # extra evidence: never a reason to degrade the snapshot
            logger.warning("job logs not read: %s", redact(exc))
        if snap.job_logs:
            failed = sum(1 for v in snap.job_logs.values() if v.get("error"))
            logger.info("job logs: %d read, %d not", len(snap.job_logs) - failed, failed)
    return snap


def idle_rows(columns: Callable[[float], tuple[Any, Any]], policy: Policy) -> list[Any]:
    """Return, for each enabled rule that finds jobs' allocated GPUs idle (registered with ``idle_jobs``), which GPU
    rows it reads as idle: fresh and under its ``util_max`` over its own window. ``columns(window)`` gives the
    ``stale`` and ``util_max`` columns over a window.

    A job may be found idle only where every GPU it holds is such a row for one of them. Read on the snapshot's primary
    window (the zombie rule's) with one threshold instead, a job idle over a shorter idle-allocation window, or a
    session under a higher idle-interactive threshold, was one the sweep could cancel without its node checked."""
    import numpy as np

    from gpu_cost.core import registry

    out = []
    for name, spec in registry.rules().items():
        cfg = getattr(policy.rules, name, None)
        if not spec.idle_jobs or cfg is None or not getattr(cfg, "enabled", True):
            continue
        stale, umax = columns(spec.window(cfg, policy))
        with np.errstate(invalid="ignore"):
            out.append(~np.asarray(stale, dtype=bool) & (np.asarray(umax, dtype=float) < cfg.util_max))
    return out


def log_candidates(snapshot: Snapshot, policy: Policy) -> list[Job]:
    """Return the running jobs whose log is worth reading this sweep: every allocated GPU fresh and
    under an idle rule's threshold over its window (:func:`idle_rows`), then (what the low-efficiency advice names
    as the cause: the job's own CPU and I/O, which the same read samples) every GPU fresh with a mean
    utilisation under ``rules.low_efficiency.util_mean_max``; at most ``max_jobs_per_sweep``, the idle
    ones first, most GPUs first."""
    import numpy as np

    cfg = policy.evidence.job_log
    g = snapshot.columns()
    if not cfg.enabled or cfg.max_jobs_per_sweep <= 0 or g.empty or "job_id" not in g:
        return []

    def columns(window: float) -> tuple[Any, Any]:
        try:
            c = snapshot.columns(window)
        except KeyError:  # a window the snapshot does not aggregate: no rule reads it
            return np.ones(len(g), dtype=bool), np.full(len(g), np.nan)
        return c.get("stale", bool), c.get("util_max", float)

    idle = idle_rows(columns, policy)
    fresh = ~g.get("stale", bool)
    low_cfg = policy.rules.low_efficiency
    low = fresh & (np.nan_to_num(g.get("util_mean", float), nan=100.0) < low_cfg.util_mean_max)
    rows: dict[str, list[int]] = {}
    for i, jid in enumerate(g.get("job_id", object).tolist()):
        if jid:
            rows.setdefault(str(jid), []).append(i)
    running = snapshot.running_jobs()
    out = [j for j in running if (mine := rows.get(j.job_id)) and any(all(r[i] for i in mine) for r in idle)]
    out.sort(key=lambda j: (-j.gpu_count, j.job_id))
    if low_cfg.enabled:
        chosen = {j.job_id for j in out}
        poor = [j for j in running if j.job_id not in chosen and (mine := rows.get(j.job_id))
                and all(low[i] for i in mine)]
        out += sorted(poor, key=lambda j: (-j.gpu_count, j.job_id))
    return out[:cfg.max_jobs_per_sweep]


def suspect_hosts(frame: Any, jobs: Sequence[Job], policy: Policy) -> list[str]:
    """Return the hosts worth an SSH inspection: a fresh GPU holding memory at ~0 % that no running job holds.

    Only such GPUs can be zombies, so a sweep inspects a handful of nodes, not the whole cluster.
    """
    if not len(frame):
        return []
    z = policy.rules.zombie
    allocated = {(h, int(i)) for j in jobs if j.running for h, idx in j.gpu_alloc for i in idx}
    # a MIG slice is held only through a job's mig_alloc: Slurm's GPU indices there count slices
    slices = {(h, s) for j in jobs if j.running for h, sl in j.mig_alloc for s in sl}
    migs = frame["mig"].fillna("").astype(str) if "mig" in frame else [""] * len(frame)
    hosts = set()
    for host, gpu, mig, stale, umax, mmin in zip(frame["host"], frame["gpu"], migs, frame["stale"], frame["util_max"],
                                                 frame["mem_min_mib"], strict=True):
        held = (str(host), f"{int(gpu)}/{mig}") in slices if mig else (str(host), int(gpu)) in allocated
        if stale or held:
            continue
        if umax == umax and mmin == mmin and umax < z.util_max and mmin > z.mem_min_mib:
            hosts.add(str(host))
    return sorted(hosts)


def idle_job_hosts(frame: Any, jobs: Sequence[Job], policy: Policy,
                   windows: Mapping[float, Any] | None = None) -> list[str]:
    """Return the hosts of running jobs whose allocated GPUs all look idle to an idle rule (:func:`idle_rows`: over
    its window, ``windows``' frame of that length or else ``frame``'s primary one): a cancel could touch them, so
    their GPU numbering is checked (:mod:`gpu_cost.perceive.gpu_map`) before anything acts there."""
    if not len(frame):
        return []

    def columns(window: float) -> tuple[Any, Any]:
        src = windows[window] if windows and window in windows else frame
        return src["stale"].to_numpy(dtype=bool), src["util_max"].to_numpy(dtype=float)

    idle = [r.tolist() for r in idle_rows(columns, policy)]
    at = {(str(h), int(g)): i for i, (h, g) in enumerate(zip(frame["host"], frame["gpu"], strict=True))}
    hosts: set[str] = set()
    for j in jobs:
        keys = j.gpu_keys() if j.running else []
        if keys and all(k in at for k in keys) and any(all(r[at[k]] for k in keys) for r in idle):
            hosts.update(h for h, _ in keys)
    return sorted(hosts)


def _merge_nodes(nodes: Sequence[Node], frame: Any, stats: dict[str, dict[str, float]]) -> list[Node]:
    """Return Slurm's nodes with node_exporter CPU and summed GPU power, plus the GPU hosts Slurm does not list
    (no node list: Slurm down) but those outside the scheduler (:func:`gpu_cost.perceive.correlate.attribute`): a
    node of theirs would count their GPUs as the cluster's, and an idle-node rule would judge them."""
    power: dict[str, float] = {}
    if len(frame):
        for host, p in zip(frame["host"], frame["power_w"], strict=True):
            if p == p:
                power[str(host)] = power.get(str(host), 0.0) + float(p)
    known = {n.name for n in nodes}
    out = list(nodes)
    if len(frame) and "attribution" in frame:
        known |= set(map(str, frame.loc[frame["attribution"] == "outside", "host"]))
    if len(frame):
        for host in sorted(set(map(str, frame["host"])) - known):
            sub = frame[frame["host"] == host]
            out.append(Node(name=host, state="unknown", gpus_total=len(sub), gpu_model=str(sub["model"].iloc[0] or "")))
    merged = []
    for n in out:
        cpu = stats.get(n.name, {}).get("cpu_util")
        changes: dict[str, Any] = {}
        if cpu is not None and not math.isnan(cpu):
            changes["cpu_util"] = round(cpu, 2)
        if n.name in power:
            changes["power_w"] = round(power[n.name], 1)
        io = [v for k in ("net_rx_bps", "net_tx_bps", "disk_read_bps", "disk_write_bps")
              if (v := stats.get(n.name, {}).get(k)) is not None and not math.isnan(v)]
        if io:
            changes["io_bps"] = round(sum(io), 1)
        merged.append(dataclasses.replace(n, **changes) if changes else n)
    return merged


def check_fresh(policy: Policy, now: float, *, prometheus: Any = None) -> tuple[bool, str]:
    """Return (fresh, why): Prometheus answers and its newest GPU sample is recent enough."""
    from gpu_cost.perceive.prometheus import PrometheusSource

    try:
        prom = prometheus or PrometheusSource()
        newest = prom.newest_sample_ts(now)
    except SourceError as exc:
        return False, redact(exc)
    if newest is None:
        return False, f"Prometheus at {redact(prom.config.url)} has no GPU sample in the 5 minutes before {now:.0f}"
    age = now - newest
    if age > policy.sweep.max_staleness:
        return False, f"the newest GPU sample is {age:.0f}s old (max_staleness {policy.sweep.max_staleness:g}s)"
    return True, f"newest GPU sample {max(age, 0):.0f}s old"
