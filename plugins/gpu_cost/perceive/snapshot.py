"""Build a :class:`~gpu_cost.core.model.Snapshot` from dense samples (simulator, traces, replays)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

import numpy as np
import pandas as pd

from gpu_cost.config.schema import Policy
from gpu_cost.core.model import GpuProcess, Job, Node, Snapshot
from gpu_cost.core.perf import gc_paused
from gpu_cost.core.redact import redact_all
from gpu_cost.perceive.aggregate import (
    CHART_CACHE,
    RollingWindows,
    clean,
    extra_window,
    gpu_frame,
    last_label,
    last_sample_ts,
)
from gpu_cost.perceive.correlate import attribute, sight_problems, some, unseen_nodes


def rule_windows(policy: Policy) -> tuple[float, list[float]]:
    """Return the primary window (the first registered rule's: zombie's) and the other windows the rules need, and
    ``offhours.window``: what idle means to the off-hours plan (its utilisation gate, each node's GPUs), read from the
    sweep's snapshot (:func:`gpu_cost.capacity.offhours.plan_power`)."""
    from gpu_cost.core import registry

    windows = [spec.window(cfg, policy) for name, spec in registry.rules().items()
               if (cfg := getattr(policy.rules, name, None)) is not None]
    windows.append(policy.offhours.window)
    primary, others = windows[0], set(windows[1:])
    return primary, sorted(w for w in others if abs(w - primary) > 1e-6 and w > 0)


@gc_paused()
def from_matrix(
    *,
    policy: Policy,
    now: float,
    source: str,
    hosts: np.ndarray,
    gpus: np.ndarray,
    uuids: np.ndarray,
    models: np.ndarray,
    mem_total: np.ndarray,
    times: np.ndarray,
    util: np.ndarray,
    mem: np.ndarray,
    power: np.ndarray | None,
    job: np.ndarray,
    jobs: Sequence[Job],
    processes: Sequence[GpuProcess],
    nodes: Sequence[Node],
    problems: Sequence[str] = (),
    mig: Mapping[str, np.ndarray] | None = None,
    rolling: RollingWindows | None = None,
    recorded: AbstractSet[str] | None = None,
    managed: AbstractSet[str] | None = None,
    doubtful: AbstractSet[str] = frozenset(),
) -> Snapshot:
    """Aggregate a GPU × time matrix and join it with jobs and processes (``mig``: the rows' MIG columns).

    :param rolling: running sums over the whole matrix ``util``/``mem`` are a slice of (a replay);
        the slice is then taken as clean.
    :param recorded: a trace's job ids, running or ended (:func:`gpu_cost.perceive.correlate.attribute`).
    :param managed: the nodes a trace's jobs file names (:func:`gpu_cost.perceive.correlate.attribute`).
    :param doubtful: nodes whose GPU numbering is in doubt (:func:`gpu_cost.perceive.gpu_map.trace_numbering`):
        their GPUs are stale, as a live sweep reads a node whose numbering disagrees (:func:`gpu_cost.perceive.gpu_map.apply`).
    """
    sw = policy.sweep
    primary, others = rule_windows(policy)
    label = last_label(job, util, mem)
    cleaned = rolling is not None
    last = None
    if not cleaned and others:
        util, mem = clean(util, mem)  # once for every window, not once per window
        cleaned = True
        last = last_sample_ts(times, util, now)  # each window's staleness reads it: once too
    frame = gpu_frame(
        hosts=hosts, gpus=gpus, uuids=uuids, models=models, mem_total=mem_total, label_job=label, times=times,
        util=util, mem=mem, power=power, now=now, window_s=primary, lookback_s=sw.lookback,
        sample_interval_s=sw.sample_interval, min_sample_ratio=sw.min_sample_ratio,
        max_staleness_s=sw.max_staleness, busy_util=sw.busy_util, mig=mig, rolling=rolling, cleaned=cleaned,
        last_ts=last,
    )
    windows = {
        w: extra_window(times, util, mem, now, w, sw.sample_interval, sw.min_sample_ratio, sw.max_staleness,
                        rolling=rolling, cleaned=cleaned, last_ts=last)
        for w in others
    }
    if doubtful:
        from gpu_cost.perceive.gpu_map import stale_hosts

        frame, windows = stale_hosts(frame, doubtful, windows)
    unseen = unseen_nodes(hosts.tolist(), jobs, nodes) if len(frame) else []
    frame, disagreements = attribute(frame, jobs, processes, nodes, recorded, unseen, managed)
    # they are stored, returned and alerted on: no credentials
    found = redact_all([*problems, *sight_problems(frame, unseen, live=False, managed=managed)])
    return Snapshot(
        ts=now, window_s=primary, lookback_s=sw.lookback, source=source, gpus=frame, jobs=tuple(jobs),
        processes=tuple(processes), nodes=tuple(nodes), problems=tuple(found), disagreements=tuple(disagreements),
        sample_interval_s=sw.sample_interval, windows=windows,
    )


#: what a sweep without framebuffer readings cannot tell, and how the rules take it (the live run's warning, the
#: replay's note)
MEMORY_NOT_MEASURED = ("a model waiting for requests cannot be told from a finished job, so memory not measured "
                       "counts as memory held: no GPU is taken for a zombie, an idle job's confidence is lowered (a "
                       "human decides unless its class or its log does), and replicas are told by owner, name and "
                       "number of GPUs")


def memory_warning(snap: Snapshot) -> list[str]:
    """Return the run's warning when the fresh GPUs of the cluster, or of some of its hosts, report no framebuffer
    memory used (an exporter without ``DCGM_FI_DEV_FB_USED``; a reading of 0 is a reading): a blind spot, not a
    degradation (every rule still reads utilisation)."""
    g = snap.columns()
    if not len(g) or "mem_max_mib" not in g:
        return []
    ours = ~g.get("stale", bool) & g.ours()
    if not ours.any():
        return []
    unread = pd.Series(np.isnan(g.get("mem_max_mib", float)[ours])).groupby(g.get("host", object)[ours]).all()
    blind = sorted(map(str, unread.index[unread.to_numpy(dtype=bool)]))
    if not blind:
        return []
    metric = "framebuffer memory used (DCGM_FI_DEV_FB_USED or nvidia_smi_memory_used_bytes)"
    if len(blind) == len(unread):
        return [f"no GPU reports {metric}: {MEMORY_NOT_MEASURED}; the report counts no GPU-hour held by a zombie"]
    return [f"no GPU of {len(blind)} of {len(unread)} host(s) ({some(blind, 5)}) reports {metric}: on those hosts, "
            f"{MEMORY_NOT_MEASURED}; the report counts no GPU-hour held by a zombie there"]


def unseen_gpu_warning(snap: Snapshot) -> list[str]:
    """Return the run's warning when running jobs hold GPUs (the scheduler's allocation) that no series shows on hosts
    whose other GPUs report: a GPU fallen off the bus, an exporter that skips one. Each such job is judged by no rule
    (no data, no action) and nobody was told. A blind spot, not a degradation: one dead GPU would otherwise stop
    every reclaim on the cluster until it is replaced. A node no series shows at all degrades the run instead
    (:func:`gpu_cost.perceive.correlate.sight_problems`)."""
    g = snap.columns()
    if not len(g) or "host" not in g or "gpu" not in g:
        return []
    hosts = [str(h) for h in g.get("host", object).tolist()]
    seen = set(zip(hosts, g.get("gpu", np.int64).tolist(), strict=True))
    reporting = set(hosts)
    missing = sorted((h, i, job.job_id) for job in snap.running_jobs() for h, i in job.gpu_keys()
                     if h in reporting and (h, i) not in seen)
    if not missing:
        return []
    shown = some([f"{h}:{i} (job {j})" for h, i, j in missing], 3)
    return [f"{len(missing)} GPU(s) that running jobs hold show no series on hosts whose other GPUs report ({shown}): "
            "those jobs are judged by no rule. A GPU the exporter stopped showing may have failed (nvidia-smi on the "
            "node; Xid 79 in its kernel log: fallen off the bus), or the exporter numbers it otherwise than Slurm"]


def disagreement_warning(snap: Snapshot) -> list[str]:
    """Return the run's warning naming the GPUs the sources disagree on (:func:`gpu_cost.perceive.correlate.attribute`:
    two jobs claim one, a label or a job's processes on a GPU Slurm allocates to none, a process of an ended job on a
    running job's GPU). The snapshot lists them instead of guessing; the run says so, where an operator reads it."""
    if not snap.disagreements:
        return []
    first = sorted(snap.disagreements, key=lambda d: (d.host, d.gpu))
    shown = "; ".join(f"{d.host}:{d.gpu}: {d.what}" for d in first[:2])
    more = f"; and {len(first) - 2} more" if len(first) > 2 else ""
    return [f"the scheduler, the exporter's labels and the GPU processes disagree on {len(first)} GPU(s) "
            f"({shown}{more})"]


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(charts: Sequence[str]) -> str:
    """Return one bar per bucket, the max over ``charts`` (one per GPU): ``▁▁▁▁▆▁▁▁▁▁▁▁``; ``·`` = no data."""
    return _sparkline(tuple(charts))


@functools.lru_cache(maxsize=CHART_CACHE)
def _sparkline(charts: tuple[str, ...]) -> str:
    """:func:`sparkline` of a tuple (most jobs' GPUs repeat a few charts: a sweep draws each set once)."""
    rows = [chart_values(c) for c in charts if c]
    if not rows:
        return ""
    # a bucket's top over the GPUs (no data is -1, under any value), as wide as the narrowest chart
    tops = rows[0] if len(rows) == 1 else [max(bucket) for bucket in zip(*rows, strict=False)]
    return "".join("·" if top < 0 else _BARS[min(len(_BARS) - 1, int(top / 100 * len(_BARS)))] for top in tops)


@functools.lru_cache(maxsize=CHART_CACHE)
def chart_values(text: str) -> tuple[float, ...]:
    """Return a chart column's bucket values, -1 for a bucket with no data (``"0,,85"`` → ``(0, -1, 85)``), each
    text parsed once: most GPUs repeat a few charts, sweep after sweep."""
    return tuple(float(x) if x != "" else -1.0 for x in text.split(","))


def from_samples(
    *,
    policy: Policy,
    now: float,
    source: str,
    samples: pd.DataFrame,
    jobs: Sequence[Job],
    processes: Sequence[GpuProcess] = (),
    nodes: Sequence[Node] = (),
    problems: Sequence[str] = (),
    recorded: AbstractSet[str] | None = None,
    managed: AbstractSet[str] | None = None,
    doubtful: AbstractSet[str] = frozenset(),
) -> Snapshot:
    """Aggregate long trace-format samples (the lookback before ``now``) into a snapshot (``recorded``, ``managed``,
    ``doubtful``: see :func:`from_matrix`)."""
    from gpu_cost.perceive.aggregate import to_dense

    keys, times, arrays = to_dense(samples, now - policy.sweep.lookback, now)
    n = len(keys)
    return from_matrix(
        policy=policy, now=now, source=source,
        hosts=keys["host"].to_numpy(dtype=object), gpus=keys["gpu"].to_numpy(dtype=np.int64),
        uuids=keys["uuid"].fillna("").to_numpy(dtype=object) if "uuid" in keys else np.full(n, "", dtype=object),
        models=keys["model"].fillna("").to_numpy(dtype=object) if "model" in keys else np.full(n, "", dtype=object),
        mem_total=keys["mem_total_mib"].to_numpy(dtype=float) if "mem_total_mib" in keys else np.full(n, np.nan),
        times=times, util=arrays["util"], mem=arrays["mem"], power=arrays["power"], job=arrays["job"],
        jobs=jobs, processes=processes, nodes=nodes, problems=problems, recorded=recorded, managed=managed,
        doubtful=doubtful,
    )
