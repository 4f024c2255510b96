"""Low efficiency: a job that has run a while with low mean utilisation — advice, never a kill.

Policy (``rules.low_efficiency``)::

    low_efficiency:
      util_mean_max: 20   # % mean over the last min_runtime across the job's GPUs
      min_runtime: 1h
      ladder: [{action: advise}]

Jobs already idle (caught by ``idle_allocation``) are left to that rule, and so are jobs busy in the
latest (primary) window: a long data-loading phase that has ended is not poor use.

The advice names the cause when the evidence shows it (:func:`input_signs`): GPUs mostly idle while
the job's own processes keep the CPU busy (at least :data:`INPUT_CORES_PER_GPU` cores per GPU) or move
``evidence.io_busy_mib_s`` (the node wrapper's sample), or while a node the job has to itself is busy
on CPU or I/O (node_exporter): the GPUs wait for data — more data-loader workers, faster storage, or
fewer GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_cost.analyse.evidence import nodes_to_itself, process_load, signal
from gpu_cost.analyse.jobrows import job_index
from gpu_cost.analyse.rules import register
from gpu_cost.analyse.rules.common import behaves_like_inference, declared_inference, job_fields, r
from gpu_cost.config.schema import Mode, Percent, Policy, Rung, Seconds
from gpu_cost.config.typed import Invalid
from gpu_cost.core.model import Finding, Job, Snapshot
from gpu_cost.core.registry import RuleSpec


@dataclass(frozen=True)
class LowEfficiencyRule:
    """A job using its GPUs poorly for a long time: advice to the owner, never a kill."""

    enabled: bool = True
    mode: Mode | None = None
    util_mean_max: Percent = 20.0
    min_runtime: Seconds = 3600.0
    ladder: tuple[Rung, ...] = (Rung("advise", 0.0),)


#: how sure low-efficiency advice is: the utilisation itself is the finding
ADVICE_CONFIDENCE = 0.8
#: the job's own processes using this many CPU cores per GPU it holds is a busy input pipeline
INPUT_CORES_PER_GPU = 2.0
#: what to change when the GPUs wait for their input
INPUT_REMEDY = "more data-loader workers, faster storage, or fewer GPUs"


def why(f: Finding) -> str:
    """The decision reason for a low-efficiency finding: the utilisation, and the cause with what to change
    when the evidence names one."""
    ev = f.evidence
    head = f"job {f.job_id}: mean utilisation {ev.get('util_mean')}% over {int(ev.get('window_s', 0)) // 60} min"
    signs = ev.get("input_bound") or []
    if signs:
        return f"{head} while {' and '.join(signs)}: its GPUs wait for data — {INPUT_REMEDY}"
    return f"{head}: fewer or smaller GPUs can do the same work"


def input_signs(snapshot: Snapshot, job: Job, policy: Policy) -> list[str]:
    """Return the signs that ``job``'s GPUs wait on its input pipeline (empty: none known): its own
    processes' CPU cores and I/O (the node wrapper's sample, read with its log), and the CPU and I/O of
    the nodes it has to itself (node_exporter)."""
    ev = policy.evidence
    load = process_load(snapshot.job_logs.get(job.job_id))  # the wrapper's sample: the log's lines say nothing here
    signs = []
    cores, io = load["cpu_cores"], load["io_bps"]
    if cores is not None and cores >= INPUT_CORES_PER_GPU * max(1, job.gpu_count):
        signs.append(f"its processes use {cores:.1f} CPU cores")
    if io is not None and io >= ev.io_busy_mib_s * 1048576:
        signs.append(f"read and write {io / 1048576:.0f} MiB/s")
    alone = nodes_to_itself(snapshot, job)
    for node in snapshot.nodes_named(alone):
        if node.cpu_util is not None and node.cpu_util >= ev.cpu_busy:
            signs.append(f"node {node.name}'s CPU is {node.cpu_util:.0f} % busy")
        if node.io_bps is not None and node.io_bps >= ev.io_busy_mib_s * 1048576:
            signs.append(f"node {node.name} moves {node.io_bps / 1048576:.0f} MiB/s")
    return signs


def check(cfg: LowEfficiencyRule, policy: Policy) -> None:
    """Refuse a threshold under which every job is ``idle_allocation``'s: the rule could never fire."""
    idle = policy.rule("idle_allocation")
    if cfg.enabled and idle.enabled and cfg.util_mean_max <= idle.util_max:
        raise Invalid("util_mean_max", f"{cfg.util_mean_max:g}% is not above rules.idle_allocation.util_max="
                                       f"{idle.util_max:g}%: every job under it is idle_allocation's, so the rule "
                                       "could never fire")


SPEC = RuleSpec(
    "low_efficiency", config=LowEfficiencyRule, rank=30, check=check, target="job", title="a job using its GPUs poorly",
    label="Low efficiency", why=why, advice_only=True,
    window=lambda cfg, policy: min(cfg.min_runtime, policy.sweep.lookback),
    doc="A job that has run at least ``min_runtime`` with a low mean utilisation: advice to the owner, "
        "never an action on the job.",
    example="""
        rules:
          low_efficiency:
            util_mean_max: 20
            min_runtime: 1h
            ladder: [{action: advise}]
    """,
)


def _nanmean(values: np.ndarray) -> float:
    """Return ``np.nanmean(values)`` of a 1-D float array to the last bit (its sum of the values with NaN as 0,
    over their count), NaN when all are NaN: without its per-call overhead (the rule asks per candidate job)."""
    ok = values == values
    n = int(np.count_nonzero(ok))
    return float(np.add.reduce(np.where(ok, values, 0.0)) / n) if n else math.nan


@register(SPEC)
def low_efficiency(snapshot: Snapshot, cfg: LowEfficiencyRule, policy: Policy) -> list[Finding]:
    """Return one advisory finding per running job with low mean utilisation."""
    window = min(cfg.min_runtime, snapshot.lookback_s)
    g = snapshot.columns(window)
    if g.empty:
        return []
    index = job_index(snapshot)
    rows = index.rows
    stale = g.get("stale", bool)
    umean = g.get("util_mean", float)
    umax = g.get("util_max", float)
    bursts = g.get("bursts_lb")
    idle_max = policy.rules.idle_allocation.util_max
    recent = snapshot.columns().get("util_mean", float)  # the primary (shortest) window, same rows
    # every job at once first: most are busy, stale or idle throughout, and need no more than this
    stale_jobs = index.any(stale)
    rough_mean = index.nanmean(umean)
    with np.errstate(invalid="ignore"):
        idle_rows = index.count(umax < idle_max)
    findings = []
    for job in snapshot.running_jobs():
        code = index.code.get(job.job_id)
        if code is None or stale_jobs[code] or not rough_mean[code] < cfg.util_mean_max + 1e-6:
            continue  # a GPU stale, no utilisation, or busy enough (the exact mean is taken below)
        keys = job.gpu_keys()
        if not keys or job.start_ts is None or snapshot.ts - job.start_ts < cfg.min_runtime:
            continue
        pos = rows[job.job_id]
        if len(pos) < len(keys) or idle_rows[code] == len(pos):
            continue  # a GPU not seen, or fully idle: idle_allocation's business
        mean = _nanmean(umean[pos])
        if np.isnan(mean) or mean >= cfg.util_mean_max:
            continue
        now_mean = _nanmean(recent[pos])
        if now_mean == now_mean and now_mean >= cfg.util_mean_max:
            continue  # busy now: a slow first phase (data loading) that is over is not poor use
        busy_gpus = int((umean[pos] >= cfg.util_mean_max).sum())
        signs = input_signs(snapshot, job, policy)
        signals = [signal("GPU utilisation", f"mean {r(mean)} % over {int(window) // 60} min on {len(keys)} GPU(s)",
                          f"under {cfg.util_mean_max:g} %: the same work would fit on fewer or smaller GPUs"),
                   signal("Busy GPUs", f"{busy_gpus} of {len(keys)}", "GPUs at or above the threshold")]
        if signs:
            signals.append(signal("Input pipeline", "; ".join(signs),
                                  f"busy while the GPUs idle: they wait for data — {INPUT_REMEDY}"))
        evidence: dict[str, Any] = {
            "util_mean": r(mean), "window_s": window, "gpus_busy": busy_gpus, "gpus": len(keys),
            "per_gpu_util_mean": [r(float(x)) for x in umean[pos]], "signals": signals,
            "confidence": ADVICE_CONFIDENCE,
        }
        if signs:
            evidence["input_bound"] = signs
        inference = bool(declared_inference(job, policy.inference) or behaves_like_inference(bursts[pos], policy.inference))
        findings.append(
            Finding(
                rule="low_efficiency", target_kind="job", target=f"job:{job.job_id}", action="advise", gpus=len(keys),
                gpu_ids=tuple(f"{h}:{i}" for h, i in keys), inference=inference, evidence=evidence,
                **job_fields(job),  # type: ignore[arg-type]
            )
        )
    return findings
