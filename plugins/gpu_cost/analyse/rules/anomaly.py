"""Anomaly: a job far off what is normal — advice or a notice to its owner, never an action on it.

Policy (``rules.anomaly``)::

    anomaly:
      leak_min_mib_per_h: 1024   # a leak: framebuffer grows at least this fast …
      leak_min_r2: 0.9           # … steadily (least-squares fit over the lookback) …
      leak_min_span: 3h          # … over at least this long of valid samples
      overrun_factor: 2          # an overrun: runtime above the class's p90 run time × this
      ladder: [{action: advise}]

Three kinds, one finding per job (``evidence.anomalies`` lists which):

``leak``     a fresh GPU of the job whose framebuffer grew steadily over the lookback
             (``mem_slope_mib_h_lb``, ``mem_r2_lb``, ``mem_span_s_lb`` of the GPU frame). A
             checkpointing sawtooth or a plateau has a low R²; a step (the GPU's previous job,
             a model loaded once) never reaches R² 0.75. The job must have run ``leak_min_span``
             itself, so the fit is over its own samples.
``overrun``  a job running longer than ``overrun_factor`` × its class's p90 run time
             (``snapshot.classes``, :mod:`gpu_cost.analyse.baselines`; a class of at least
             ``baselines.min_members``, not a service) with no sign of progress in the rule
             window: its log not written (:func:`gpu_cost.analyse.evidence.classify_log`), GPU power at an
             idle GPU's (:func:`gpu_cost.analyse.evidence.progress`), CPU quiet, GPU utilisation under
             ``sweep.busy_util``. Declared or bursty inference services are left alone.
``mix``      a CPU/GPU mix unlike its class's: while its GPUs work (mean utilisation at least
             ``sweep.busy_util``), the CPU of the node it has to itself is ``mix_factor`` times
             above or below its class's (``cpu_pct_active`` of at least ``baselines.min_members``
             members with CPU data).

A job with any GPU missing or stale is skipped: no data, no finding. The rule is advice-only
(``advice_only``): the policy loader refuses a destructive rung on its ladder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np

from gpu_cost.analyse.evidence import classify_log, progress, signal
from gpu_cost.analyse.jobrows import job_index
from gpu_cost.analyse.rules import register
from gpu_cost.analyse.rules.common import behaves_like_inference, declared_inference, job_fields, r
from gpu_cost.config.schema import Mode, Policy, Rung, Share
from gpu_cost.config.typed import Dur, Range
from gpu_cost.core.model import Finding, GpuColumns, Job, Snapshot
from gpu_cost.core.registry import RuleSpec


@dataclass(frozen=True)
class AnomalyRule:
    """A job far off its class's baseline: a framebuffer that grows steadily (a leak), a run much
    longer than its class's without progress, or a CPU/GPU mix unlike its class's. Advice or a
    notice, never destructive on its own."""

    enabled: bool = True
    mode: Mode | None = None
    #: a leak: memory grows at least this fast, steadily (fit R² at least ``leak_min_r2``) over the lookback
    leak_min_mib_per_h: Annotated[float, Range(1, 10_000_000)] = 1024.0
    leak_min_r2: Share = 0.9
    #: and over at least this long
    leak_min_span: Annotated[float, Dur(), Range(600, 7 * 86400)] = 3 * 3600.0
    #: an overrun: runtime above the class's p90 run time times this, with no progress in the window
    overrun_factor: Annotated[float, Range(1, 100)] = 2.0
    #: a CPU/GPU mix: the node's CPU while the GPUs work at least this many times above (or below) its class's
    mix_factor: Annotated[float, Range(1.5, 100)] = 3.0
    ladder: tuple[Rung, ...] = (Rung("advise", 0.0),)


#: the GPU frame's trend columns the leak check reads (an older stored snapshot may lack them)
TREND = ("mem_slope_mib_h_lb", "mem_r2_lb", "mem_span_s_lb")


def _h(seconds: float | None) -> str:
    """Return a duration in hours for the reason text: ``4 h``, ``2.5 h``."""
    if seconds is None:
        return "?"
    h = float(seconds) / 3600.0
    return f"{h:.0f} h" if h >= 10 else f"{h:.1f}".rstrip("0").rstrip(".") + " h"


def why(f: Finding) -> str:
    """The decision reason for an anomaly finding, in plain words."""
    ev = f.evidence
    parts = []
    if "leak" in ev.get("anomalies", ()):
        gib = float(ev.get("slope_mib_per_h") or 0.0) / 1024.0
        text = (f"GPU memory grew {gib:.1f} GiB/h for {_h(ev.get('span_s'))} (R² {float(ev.get('r2') or 0):.2f})"
                f" on {ev.get('gpu')}")
        if ev.get("hours_to_full") is not None:
            text += f", full in about {float(ev['hours_to_full']):.1f} h"
        parts.append(text + ": a leak?")
    if "mix" in ev.get("anomalies", ()):
        parts.append(f"node CPU {ev.get('cpu_pct')} % while its GPUs work, {ev.get('cpu_ratio')}× the "
                     f"{ev.get('class_cpu_pct')} % of its class: an unusual CPU/GPU mix")
    if "overrun" in ev.get("anomalies", ()):
        parts.append(f"running {_h(ev.get('runtime_s'))}, {float(ev.get('runtime_ratio') or 0):.1f}× the "
                     f"{_h(ev.get('class_p90_s'))} p90 of its class ({ev.get('class_members')} jobs) "
                     "with no sign of progress: stuck?")
    return f"job {f.job_id}: " + "; ".join(parts or [str(ev.get("anomaly", "anomaly"))])


SPEC = RuleSpec(
    "anomaly", config=AnomalyRule, rank=60, target="job", title="a job far off its class's baseline",
    label="Anomalies", why=why, advice_only=True,
    # the primary window (zombie's, the first rule's): mean power is aggregated there only
    window=lambda cfg, policy: policy.rules.zombie.window,
    doc="A job far off what is normal: GPU memory growing steadily over the lookback (a leak), or a run far "
        "longer than its class's p90 run time with no sign of progress (an overrun). Advice, never an action "
        "on the job.",
    example="""
        rules:
          anomaly:
            leak_min_mib_per_h: 1024
            leak_min_r2: 0.9
            leak_min_span: 3h
            overrun_factor: 2
            ladder: [{action: advise}]
    """,
)


def _is_service(klass: dict[str, Any]) -> bool:
    # as gpu_cost.analyse.baselines.is_service: the class behaves like one, or the member itself does
    return klass.get("kind") == "service" or klass.get("member_kind") == "service"


def _leaking(g: GpuColumns, cfg: AnomalyRule) -> np.ndarray:
    """Return per GPU row whether its framebuffer grew steadily over the lookback (False without the trend columns)."""
    if any(c not in g for c in TREND):
        return np.zeros(len(g.get("stale", bool)), dtype=bool)
    with np.errstate(invalid="ignore"):
        return ((g.get("mem_slope_mib_h_lb", float) >= cfg.leak_min_mib_per_h) & (g.get("mem_r2_lb", float) >= cfg.leak_min_r2)
                & (g.get("mem_span_s_lb", float) >= cfg.leak_min_span))


def _leak(g: GpuColumns, pos: np.ndarray, job: Job, snapshot: Snapshot, cfg: AnomalyRule,
          growing: np.ndarray) -> dict[str, Any] | None:
    """Return the leak evidence of a job's GPUs (the fastest steady grower; ``growing``: :func:`_leaking`), or None."""
    if any(c not in g for c in TREND) or job.start_ts is None or snapshot.ts - job.start_ts < cfg.leak_min_span:
        return None
    slope = g.get("mem_slope_mib_h_lb", float)[pos]
    r2 = g.get("mem_r2_lb", float)[pos]
    leaking = growing[pos]
    span = g.get("mem_span_s_lb", float)[pos]
    if not leaking.any():
        return None
    best = int(np.argmax(np.where(leaking, slope, -np.inf)))
    row = int(pos[best])
    hosts, idx = g.get("host", object), g.get("gpu")
    now_mib = float(g.get("mem_max_mib", float)[row])
    total = float(g.get("mem_total_mib", float)[row])
    to_full = max(0.0, (total - now_mib) / slope[best]) if total == total and now_mib == now_mib and total > 0 else None
    return {
        "slope_mib_per_h": r(float(slope[best])), "r2": r(float(r2[best]), 3), "span_s": round(float(span[best])),
        "gpu": f"{hosts[row]}:{int(idx[row])}", "mem_now_mib": r(now_mib), "mem_total_mib": r(total),
        "hours_to_full": r(to_full) if to_full is not None else None,
        "leaking_gpus": [f"{hosts[p]}:{int(idx[p])}" for p, ok in zip(pos, leaking, strict=True) if ok],
    }


def _leak_signals(ev: dict[str, Any], cfg: AnomalyRule) -> tuple[list[dict[str, Any]], float]:
    sig = [
        signal("Framebuffer slope", f"{ev['slope_mib_per_h']:g} MiB/h",
               f"at least {cfg.leak_min_mib_per_h:g} MiB/h: growing"),
        signal("Fit R²", ev["r2"], f"at least {cfg.leak_min_r2:g}: steady growth, not a sawtooth or a step"),
        signal("Span of samples", _h(ev["span_s"]), f"at least {_h(cfg.leak_min_span)}"),
    ]
    steady = (float(ev["r2"]) - cfg.leak_min_r2) / max(1e-9, 1.0 - cfg.leak_min_r2)
    c = 0.6 + 0.3 * min(1.0, max(0.0, steady))
    if ev["hours_to_full"] is not None:
        soon = ev["hours_to_full"] <= 24
        sig.append(signal("Until the framebuffer is full", f"{ev['hours_to_full']:g} h",
                          "within a day: likely to fail" if soon else "more than a day away"))
        c += 0.1 if soon else 0.0
    return sig, round(min(1.0, c), 2)


def _overrun(g: GpuColumns, pos: np.ndarray, job: Job, snapshot: Snapshot, cfg: AnomalyRule, policy: Policy,
             window: float) -> tuple[dict[str, Any], list[dict[str, Any]], float] | None:
    """Return the overrun evidence, its signals and confidence, or None."""
    klass = snapshot.classes.get(job.job_id)
    if not klass or job.start_ts is None:
        return None
    members = int(klass.get("members") or 0)
    p90 = klass.get("runtime_p90_s")
    if members < policy.baselines.min_members or p90 is None or not float(p90) > 0 or _is_service(klass):
        return None
    runtime = snapshot.ts - job.start_ts
    limit = cfg.overrun_factor * float(p90)
    if runtime <= limit:
        return None
    if declared_inference(job, policy.inference) or behaves_like_inference(g.get("bursts_lb")[pos],
                                                                           policy.inference):
        return None  # a service by declaration or behaviour: long runs are its nature
    power = [float(x) for x in g.get("power_w", float)[pos]]
    log = classify_log(snapshot.job_logs.get(job.job_id), policy.evidence.job_log, snapshot.ts, window)
    signs = progress(snapshot, job, power, log, policy)
    util = float(np.nanmean(g.get("util_mean", float)[pos])) if len(pos) else math.nan
    if util == util and util >= policy.sweep.busy_util:
        signs.append(f"GPU utilisation {util:.0f} %, at least the busy {policy.sweep.busy_util:g} %")
    if signs:
        return None
    ratio = runtime / float(p90)
    ev = {
        "runtime_s": round(runtime), "class_p90_s": round(float(p90)), "overrun_factor": cfg.overrun_factor,
        "runtime_ratio": r(ratio, 2), "class_key": klass.get("key"), "class_members": members,
        "class_kind": klass.get("kind") or "unknown", "window_s": window, "util_mean": r(util),
        "power_w": r(float(np.nanmax(power))) if any(p == p for p in power) else None,
        "log_state": log.get("state"), "log_written_s_ago": log.get("written_s_ago"),
    }
    sig = [
        signal("Runtime", _h(runtime), f"{ratio:.1f}× its class's p90 of {_h(float(p90))}: beyond the "
                                       f"{cfg.overrun_factor:g}× of rules.anomaly.overrun_factor"),
        signal("Class", f"{klass.get('key')} ({members} jobs, {ev['class_kind']})",
               f"at least baselines.min_members={policy.baselines.min_members}: a baseline to judge by"),
        signal("GPU utilisation", f"{util:.1f} %" if util == util else "unknown",
               f"under the busy {policy.sweep.busy_util:g} %: no work seen"),
        signal("GPU power", f"{ev['power_w']:g} W" if ev["power_w"] is not None else "unknown",
               f"at most the {policy.evidence.power_active_w:g} W of an idle GPU" if ev["power_w"] is not None
               else "not reported: not counted"),
    ]
    c = 0.6
    if ratio >= 2 * cfg.overrun_factor:
        c += 0.1
    if log.get("state") in ("finished", "crashed"):
        c += 0.25
        sig.append(signal("Job log", log.get("line"), f"says it {log['state']}: the work is over, the GPUs still held"))
    elif log.get("read"):
        c += 0.05
        sig.append(signal("Job log", f"written {log.get('written_s_ago')} s ago" if log.get("written_s_ago") is not None
                          else "no time", "quiet over the window"))
    else:
        sig.append(signal("Job log", log.get("error") or "not read", "not counted"))
    if members < 2 * policy.baselines.min_members:
        c -= 0.1
        sig.append(signal("Class size", members, "a small class: its p90 is rough"))
    return ev, sig, round(min(1.0, max(0.0, c)), 2)


def _mix(g: GpuColumns, pos: np.ndarray, job: Job, snapshot: Snapshot, cfg: AnomalyRule,
         policy: Policy) -> tuple[dict[str, Any], list[dict[str, Any]], float] | None:
    """A CPU/GPU mix unlike the class's: the node's CPU while the GPUs work, ``mix_factor`` times above or below
    the class's (both on nodes the jobs have to themselves; a class of ``baselines.min_members`` with CPU data)."""
    from gpu_cost.analyse.evidence import nodes_to_itself

    klass = snapshot.classes.get(job.job_id) or {}
    ref = klass.get("cpu_pct_active")
    if ref is None or int(klass.get("cpu_members") or 0) < policy.baselines.min_members or _is_service(klass):
        return None
    util = float(np.nanmean(g.get("util_mean", float)[pos]))
    if not util == util or util < policy.sweep.busy_util:
        return None  # the mix is read while the GPUs work
    alone = nodes_to_itself(snapshot, job)
    cpus = [n.cpu_util for n in snapshot.nodes if n.name in alone and n.cpu_util is not None]
    names = set(job.nodes or [h for h, _ in job.gpu_alloc])
    if not cpus or len(cpus) < len(names):
        return None
    cpu = float(np.mean(cpus))
    ref = max(float(ref), 1.0)
    ratio = max(cpu, 1.0) / ref
    if 1 / cfg.mix_factor < ratio < cfg.mix_factor:
        return None
    high = ratio >= cfg.mix_factor
    ev = {"cpu_pct": round(cpu, 1), "class_cpu_pct": round(ref, 1), "cpu_ratio": round(ratio, 2),
          "class_key": klass.get("key"), "class_members": klass.get("members"), "util_mean": round(util, 1)}
    what = ("far more CPU than its class: preprocessing or data loading on the CPU may be holding the GPUs back"
            if high else "far less CPU than its class: a data loader with too few workers, or a stalled input")
    sig = [signal("CPU/GPU mix", f"node CPU {cpu:.0f} % with the GPUs at {util:.0f} %, its class {ref:.0f} %",
                  f"{ratio:.1f}× its class's ({cfg.mix_factor:g}× or 1/{cfg.mix_factor:g} of it counts): {what}"),
           signal("Class", f"{klass.get('key')} ({klass.get('members')} jobs)", "the CPU on nodes its jobs had alone")]
    return ev, sig, 0.6


@register(SPEC)
def anomaly(snapshot: Snapshot, cfg: AnomalyRule, policy: Policy) -> list[Finding]:
    """Return one advisory finding per running job with a memory leak, an overrun or an unusual CPU/GPU mix."""
    # the primary window's aggregates (the only ones with mean power); the trend columns are the lookback's
    g, window = snapshot.gpus, snapshot.window_s
    if g.empty or "job_id" not in g:
        return []
    index = job_index(snapshot)
    rows = index.rows
    cols = snapshot.columns()
    stale_jobs = index.any(cols.get("stale", bool))
    growing = _leaking(cols, cfg)
    leaking_jobs = index.any(growing)
    findings = []
    for job in snapshot.running_jobs():
        code = index.code.get(job.job_id)
        if code is None or stale_jobs[code] or not (leaking_jobs[code] or job.job_id in snapshot.classes):
            continue  # a GPU stale, or neither a growing framebuffer nor a class to judge by: nothing to find
        keys = job.gpu_keys()
        pos = rows[job.job_id]
        if not keys or len(pos) < len(keys):
            continue  # some GPU of the job is missing: no data, no finding
        kinds: list[str] = []
        evidence: dict[str, Any] = {}
        signals: list[dict[str, Any]] = []
        conf: list[float] = []
        leak = _leak(cols, pos, job, snapshot, cfg, growing) if leaking_jobs[code] else None  # no GPU of it grows
        if leak is not None:
            kinds.append("leak")
            evidence.update(leak)
            s, c = _leak_signals(leak, cfg)
            signals += s
            conf.append(c)
        over = _overrun(cols, pos, job, snapshot, cfg, policy, window)
        if over is not None:
            kinds.append("overrun")
            evidence.update(over[0])
            signals += over[1]
            conf.append(over[2])
        mix = _mix(cols, pos, job, snapshot, cfg, policy)
        if mix is not None:
            kinds.append("mix")
            evidence.update(mix[0])
            signals += mix[1]
            conf.append(mix[2])
        if not kinds:
            continue
        evidence.update(anomaly=kinds[0], anomalies=kinds, signals=signals, confidence=max(conf))
        hosts = sorted({h for h, _ in keys})
        findings.append(
            Finding(
                rule="anomaly", target_kind="job", target=f"job:{job.job_id}", action="advise", gpus=len(keys),
                host=hosts[0] if len(hosts) == 1 else None, gpu_ids=tuple(f"{h}:{i}" for h, i in keys),
                inference=bool(declared_inference(job, policy.inference)), evidence=evidence,
                **job_fields(job),  # type: ignore[arg-type]
            )
        )
    return findings
