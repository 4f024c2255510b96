"""Helpers shared by the rules: per-job GPU views and inference recognition."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_cost.analyse import baselines, evidence, replicas
from gpu_cost.analyse.jobrows import job_index
from gpu_cost.config.schema import InferenceConfig, InteractiveConfig, Policy
from gpu_cost.core.globs import any_glob
from gpu_cost.core.model import Finding, GpuColumns, Job, Snapshot, device_id
from gpu_cost.perceive.snapshot import sparkline


def shared_rows(frame: GpuColumns) -> dict[str, np.ndarray]:
    """Return row positions per job among the sharers of a shared device (``attribution == "shared"``)."""
    if "sharers" not in frame:
        return {}
    out: dict[str, list[int]] = {}
    for pos, text in enumerate(frame.get("sharers", object)):
        for jid in str(text or "").split(","):
            if jid:
                out.setdefault(jid, []).append(pos)
    return {k: np.array(v) for k, v in out.items()}


class Devices:
    """The frame's device ids and shares, read once per rule run (a rule asks per finding).

    :param frame: a snapshot's GPU columns (MIG columns optional).
    """

    def __init__(self, frame: GpuColumns) -> None:
        self.hosts = frame.get("host", object)
        self.idx = frame.get("gpu")
        self.migs = frame.get("mig", object) if "mig" in frame else None
        self.shares = frame.get("share", float) if "share" in frame else None
        self.profiles = frame.get("mig_profile", object) if "mig_profile" in frame else None

    def __call__(self, pos: np.ndarray) -> tuple[tuple[str, ...], float | None]:
        """Return the device ids of rows ``pos`` (``gpu01:3``, ``gpu01:0/mig2``) and their whole-GPU share.

        The share is None when every row is a whole GPU: the finding's ``gpus`` already says what it holds.
        """
        migs = self.migs[pos] if self.migs is not None else [""] * len(pos)
        ids = tuple(device_id(str(h), int(i), str(m or "")) for h, i, m in
                    zip(self.hosts[pos], self.idx[pos], migs, strict=True))
        if self.shares is None or not any(migs):
            return ids, None
        return ids, round(float(np.sum(self.shares[pos])), 4)

    def mig_profiles(self, pos: np.ndarray) -> list[str]:
        """Return the MIG profiles among rows ``pos``, sorted."""
        return [] if self.profiles is None else sorted({str(x) for x in self.profiles[pos] if x})


def per_node(ids: Iterable[str]) -> dict[str, int]:
    """Return devices per node for device ids (``gpu01:3`` → ``{"gpu01": 1}``)."""
    out: dict[str, int] = {}
    for d in ids:
        host = d.rsplit(":", 1)[0]
        out[host] = out.get(host, 0) + 1
    return out


def declared_inference(job: Job, cfg: InferenceConfig) -> str | None:
    """Return why the policy declares ``job`` an inference service, or None."""
    return declared(job, cfg.partitions, cfg.name_patterns, cfg.labels)


def declared(job: Job, partitions: Iterable[str], name_patterns: Iterable[str], labels: Iterable[str]) -> str | None:
    """Return which of a policy's partitions, name globs (case-insensitive) or labels names ``job``, or None."""
    return _declaration(tuple(partitions), tuple(name_patterns), tuple(labels))(job)


@functools.lru_cache(maxsize=256)
def _declaration(partitions: tuple[str, ...], name_patterns: tuple[str, ...],
                 labels: tuple[str, ...]) -> Callable[[Job], str | None]:
    """Return :func:`declared` for one policy's partitions, globs and labels: the globs joined in one regex, read
    once per policy, not per job (every sweep asks it of every running job)."""
    parts = frozenset(partitions)
    lowered = [(pat, pat.lower()) for pat in name_patterns]
    any_named = any_glob(low for _, low in lowered).match if lowered else None

    def named(job: Job) -> str | None:
        if job.partition and job.partition in parts:
            return f"partition {job.partition}"
        if job.name and any_named is not None:
            name = job.name.lower()
            if any_named(name):  # one test for the many jobs no glob names; then which one
                for pat, low in lowered:
                    if fnmatch.fnmatchcase(name, low):
                        return f"name matches {pat}"
        for label in labels:
            if label in job.labels:
                return f"label {label}"
        return None

    return named


def behaves_like_inference(bursts: Iterable[int], cfg: InferenceConfig) -> bool:
    """Return True when the GPUs show repeated idle→busy bursts within the lookback."""
    values = [int(b) for b in bursts]
    return bool(values) and max(values) >= cfg.min_bursts


@dataclass(frozen=True)
class ServiceVerdict:
    """Whether a job is a service, and why: what both ways in that may end a job read (the sweep's idle
    rules and an operator's manual reclaim), so neither takes a service for waste the other would spare."""

    #: why the job is a service (the first of: declared, bursty, its class baseline, a spare replica), or None
    reason: str | None
    #: its class baseline recognises a service
    baseline: bool
    #: the replica set it is spare capacity of (its other members serve), or None
    spare: Any


def service_verdict(snapshot: Snapshot, policy: Policy, job: Job, *, bursts: int,
                    log: Mapping[str, Any]) -> ServiceVerdict:
    """Return whether ``job`` is a service: declared in ``inference:``, bursty within the lookback (``bursts``: the
    max of its GPUs' idle→busy bursts), recognised by its class baseline, or an idle replica of a set whose other
    members serve — unless its own log (``log``: :func:`gpu_cost.analyse.evidence.classify_log`) says it finished or
    crashed."""
    klass = snapshot.classes.get(job.job_id)
    baseline = baselines.is_service(klass)
    spare = None if log.get("state") in ("finished", "crashed") else replicas.spare(snapshot, policy, job.job_id)
    reason = (declared_inference(job, policy.inference)
              or (f"{bursts} bursts of activity in the lookback" if behaves_like_inference((bursts,), policy.inference)
                  else None)
              or (baselines.describe(klass) if baseline else None)
              or (spare.describe() if spare is not None else None))
    return ServiceVerdict(reason=reason, baseline=baseline, spare=spare)


def job_bursts(snapshot: Snapshot, job_id: str) -> int:
    """Return the max idle→busy bursts over the lookback of the job's GPUs in ``snapshot`` (0: none seen)."""
    if "job_id" not in snapshot.gpus or "bursts_lb" not in snapshot.gpus:
        return 0  # no GPU attributed to a job: none of its bursts seen
    pos = job_index(snapshot).rows.get(job_id)  # a job's rows, at least one
    if pos is None:
        return 0
    values = snapshot.columns().get("bursts_lb", float)[pos]
    values = values[~np.isnan(values)]
    return int(values.max()) if len(values) else 0


def job_fields(job: Job) -> dict[str, object]:
    """Return the Finding fields that describe a job."""
    return {
        "job_id": job.job_id,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "qos": job.qos,
        "name": job.name,
        "labels": job.labels,
        "nodes": job.nodes,
        "job_start_ts": job.start_ts,
        "time_limit_s": job.time_limit_s,
    }


def r(value: float, digits: int = 1) -> float | None:
    """Round for evidence; NaN becomes None so evidence stays valid JSON."""
    if value is None or value != value:
        return None
    return round(float(value), digits)


def interactive_session(job: Job, cfg: InteractiveConfig) -> str | None:
    """Return why ``job`` is an interactive session (salloc, srun --pty, a notebook), or None."""
    if cfg.batch_flag and job.batch is False:
        return "no batch script (salloc or srun)"
    return declared(job, cfg.partitions, cfg.name_patterns, cfg.labels)


def sessions(snapshot: Snapshot, cfg: InteractiveConfig) -> list[str | None]:
    """Return :func:`interactive_session` of each of ``snapshot``'s running jobs, in their order: asked once per
    sweep's jobs and policy, though both idle rules read it."""
    found: dict[InteractiveConfig, list[str | None]] = snapshot.memo("interactive_sessions", snapshot.jobs, dict)
    if cfg not in found:
        found[cfg] = [interactive_session(job, cfg) for job in snapshot.running_jobs()]
    return found[cfg]


def idle_jobs(snapshot: Snapshot, rule: str, cfg: Any, policy: Policy, *, interactive: bool) -> list[Finding]:
    """Return a finding per running job whose allocated GPUs were all idle over ``cfg.window``.

    The idle-allocation rule takes batch jobs (``interactive=False``), the idle-interactive rule
    sessions (``interactive=True``): each job is judged by exactly one of them. A job with any GPU
    missing or stale is skipped (no data, no action); so is a job showing progress (its log
    written within the window, GPU power or its node's CPU busy: :func:`gpu_cost.analyse.evidence.progress`).
    Services — declared in ``inference:``, bursty within the lookback, recognised by their class
    baseline (:mod:`gpu_cost.analyse.baselines`), or idle replicas of a set whose other members serve
    (:mod:`gpu_cost.analyse.replicas`; unless the job's own log says it finished or crashed) — are reported
    with ``inference=True`` and only advised. Each finding carries its ``signals`` (what was read,
    its value, why it counted), a ``confidence`` and ``mem_resident`` (the engine's test of a job
    it cannot classify).
    """
    # each job is the business of one of the two rules: the other's jobs are not read at all
    candidates = [(job, session) for job, session in zip(snapshot.running_jobs(), sessions(snapshot, policy.interactive),
                                                         strict=True) if bool(session) == interactive]
    if not candidates:
        return []
    g = snapshot.columns(cfg.window)
    if g.empty:
        return []
    index = job_index(snapshot)
    rows = index.rows
    shared = shared_rows(g)
    devices = Devices(g)
    sharers = g.get("sharers", object) if "sharers" in g else None
    stale = g.get("stale", bool)
    umax = g.get("util_max", float)
    umean = g.get("util_mean", float)
    power = g.get("power_w", float) if "power_w" in g else np.full(len(g), np.nan)
    memmin = g.get("mem_min_mib", float)
    bursts = g.get("bursts_lb")
    umax_lb = g.get("util_max_lb", float)
    charts = g.get("util_chart_lb", object) if "util_chart_lb" in g else None
    with np.errstate(invalid="ignore"):
        not_idle = index.any(stale | np.isnan(umax) | ~(umax < cfg.util_max)).tolist()  # per job, all its rows at once
    # per job, over its own rows (exact: maxima and minima), for the jobs on no shared device
    per_job = zip(index.reduce(np.maximum, umax).tolist(), index.reduce(np.fmax, umax_lb).tolist(),
                  index.reduce(np.fmin, memmin).tolist(), index.reduce(np.maximum, bursts).tolist(), strict=True)
    own = [(top, top_lb, None if least != least else least, int(b) if b == b else 0) for top, top_lb, least, b in per_job]
    findings = []
    for job, session in candidates:
        on_shared = shared.get(job.job_id)
        code = None
        if on_shared is None:
            code = index.code.get(job.job_id)
            if code is None or not_idle[code]:
                continue  # some GPU of the job is busy, stale or not seen
        keys = job.gpu_keys()
        if not keys or job.start_ts is None or snapshot.ts - job.start_ts < max(cfg.min_runtime, cfg.window):
            continue
        pos = rows.get(job.job_id)
        if on_shared is not None:
            pos = on_shared if pos is None else np.concatenate([pos, on_shared])
        if pos is None or len(pos) < len(keys):
            continue  # some GPU of the job is not seen: no data, no action
        if code is not None:
            top, top_lb, mem, n_bursts = own[code]  # its own rows, every one idle (not_idle above)
        elif stale[pos].any() or np.isnan(umax[pos]).any() or not (umax[pos] < cfg.util_max).all():
            continue
        else:
            top, top_lb = float(np.max(umax[pos])), float(np.nanmax(umax_lb[pos]))
            mem = float(np.nanmin(memmin[pos])) if not np.isnan(memmin[pos]).all() else None
            n_bursts = int(np.max(bursts[pos]))
        log = evidence.classify_log(snapshot.job_logs.get(job.job_id), policy.evidence.job_log, snapshot.ts,
                                    cfg.window)
        signs = evidence.progress(snapshot, job, list(power[pos]), log, policy)
        if signs:
            continue  # a data-loading or checkpointing phase: not waste
        klass = snapshot.classes.get(job.job_id)
        verdict = service_verdict(snapshot, policy, job, bursts=n_bursts, log=log)  # n_bursts: the max of its GPUs'
        service, spare = verdict.baseline, verdict.spare
        resident = None if mem is None else mem > policy.rules.zombie.mem_min_mib
        conf, conf_why = evidence.confidence(log, klass, bursts=n_bursts, resident=resident, measured=mem is not None)
        signals = [evidence.signal(
            "GPU utilisation", f"max {r(top)} % over {int(cfg.window) // 60} min",
            f"every allocated GPU under {cfg.util_max:g} %")]
        if mem is not None:
            signals.append(evidence.signal("GPU memory", f"{mem / 1024:.1f} GiB held at least",
                                           "memory resident: a model or a lingering process" if mem >
                                           policy.rules.zombie.mem_min_mib else "empty: nothing on the GPUs"))
        if log.get("read"):
            signals.append(evidence.signal(
                "Job log", log.get("line") or f"last written {log.get('written_s_ago')} s ago",
                f"it says the job {log['state']}" if log.get("state") else "quiet: no progress lines"))
        elif log.get("error"):
            signals.append(evidence.signal("Job log", "not read", str(log["error"])))
        if klass:
            signals.append(evidence.signal("Class baseline", baselines.describe(klass),
                                           "behaves like a service: advice only" if service else "no service pattern"))
        if session:
            signals.append(evidence.signal("Interactive session", session, "idle while someone types is normal: "
                                           "a longer window and a gentler ladder"))
        if spare is not None:
            signals.append(evidence.signal("Replica set", spare.describe(),
                                           f"spare capacity of a serving set: {spare.advice()}"))
        mean = float(np.add.reduce(umean[pos]) / len(pos))  # ndarray.mean's sum and division, without its overhead
        ev: dict[str, Any] = {
            "util_max": r(top), "util_mean": r(mean),
            "window_s": cfg.window, "util_max_lookback": r(top_lb),
            "bursts_lookback": n_bursts, "runtime_s": round(snapshot.ts - job.start_ts),
            "confidence": conf, "confidence_why": conf_why, "signals": signals, "mem_resident": resident,
        }
        if mem is not None:
            ev["mem_min_mib"] = r(mem)
        else:
            ev["mem_measured"] = False  # no memory sample: a waiting model cannot be told from a finished job
        if charts is not None:
            ev["chart"] = sparkline([str(c) for c in charts[pos] if c])
            ev["chart_span_s"] = snapshot.lookback_s
        if log.get("state"):
            ev["log_state"], ev["log_line"] = log["state"], log.get("line")
        if klass:
            ev["class"] = {k: klass.get(k) for k in evidence.CLASS_KEYS}
        if session:
            ev["interactive"] = session
        why_service = verdict.reason
        if spare is not None:
            ev["replica_set"] = spare.evidence()
        if why_service:
            ev["inference"] = why_service
        hosts = sorted({h for h, _ in keys})
        ids, share = devices(pos)
        gpu_ids = tuple(f"{h}:{i}" for h, i in keys) if share is None else ids
        if share is not None:
            ev["gpu_share"] = share
            ev["mig_profiles"] = devices.mig_profiles(pos)
        if len(hosts) > 1:
            # a multi-node job is judged over all its GPUs on all its nodes
            ev["per_node"] = {h: {"gpus": n, "idle": n} for h, n in sorted(per_node(ids).items())}
        refused = None
        if on_shared is not None and sharers is not None:
            mine = set(on_shared.tolist())
            sharing = {ids[k]: str(sharers[p]).split(",") for k, p in enumerate(pos) if p in mine}
            ev["shared"] = sharing
            refused = (f"{len(sharing)} of its GPU(s) shared with other jobs "
                       f"({', '.join(sorted({j for js in sharing.values() for j in js} - {job.job_id}))}): the "
                       "device's utilisation is not this job's alone, so it is never acted on; advice only")
            ev["refused"] = refused
            signals.append(evidence.signal("Shared GPU", ", ".join(f"{d}: jobs {','.join(js)}" for d, js in sharing.items()),
                                           "several jobs on one device: attributed by process, never acted on"))
        findings.append(
            Finding(
                rule=rule, target_kind="job", target=f"job:{job.job_id}",
                action="advise" if (why_service or refused) else "cancel", gpus=len(keys),
                host=hosts[0] if len(hosts) == 1 else None, gpu_ids=gpu_ids,
                inference=bool(why_service), evidence=ev, gpu_share=share,
                **job_fields(job),  # type: ignore[arg-type]
            )
        )
    return findings
