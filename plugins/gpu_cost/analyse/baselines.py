"""Class baselines: what is normal for each user and kind of job, learnt over days from the sweeps.

Judged one job at a time over a few hours, a quiet inference endpoint looks exactly like an
abandoned job: its GPUs idle, its model resident in memory. Judged against its *class* — the jobs
of the same user, account, partition, name stem (numbers and hashes stripped) and GPU count — it
is one of many long-lived members that wake from long quiet spells: a service.

Every sweep calls :func:`observe` with its snapshot (the DAG's collect task, ``gpu-cost sweep``,
and the replay, which learns from the trace as it plays it and so never from samples after the
sweep's instant). It updates one ``gpu_cost_class_members`` row per running job (the wall time
it was seen, active, idle, idle with memory resident; its wakes: activity after at least
``baselines.quiet_gap`` of quiet; its node's CPU while active, on a node it has alone: the class's
CPU/GPU mix) and puts each running job's class baseline in
``snapshot.classes`` for the rules. A class too small at the fine level (fewer than
``baselines.min_members``) is judged at the coarse level (account, partition, GPUs).

A class's ``kind``:

``service``   at least ``min_members`` long-lived members; GPUs busy at most ``service_max_busy_share``
              of the time; memory resident at least ``service_min_mem_resident`` of the quiet time;
              at least ``service_min_waking_share`` of the long-lived members woke from a quiet spell.
``training``  at least ``min_members`` members, busy at least 60 % of the time.
``unknown``   anything else, and any class with too few members.

A young class — its oldest member younger than ``long_lived`` and fewer than ``min_members``
long-lived — is not left ``unknown`` until days pass (cold start): when at least ``min_members``
of its members run now and have been seen for ``baselines.cold_start``, it is judged by what
they did in those hours, each member counting once (its own busy share, memory resident share,
and whether it woke), with the same thresholds; ``cold_start_s`` says how many hours of history
that was.

A member that has woken ``member_min_wakes`` times itself, with memory resident while quiet, is a
service whatever its class (``member_kind``). Members are weighed by recency (``half_life``) and
forgotten ``forget_after`` after they were last seen. The update is idempotent per data instant:
a retried sweep counts nothing twice.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import re
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gpu_cost.analyse.jobrows import job_index
from gpu_cost.config.schema import BaselinesConfig, Policy
from gpu_cost.core.model import Job, Snapshot

logger = logging.getLogger(__name__)

_HEXISH = re.compile(r"^(?=.*\d)[0-9a-f]{4,}$")
_TOKEN = re.compile(r"([-_./:@+ ]+)")
#: a class busy at least this share of the time is training
TRAINING_MIN_BUSY = 0.6


@functools.lru_cache(maxsize=65536)
def name_stem(name: str) -> str:
    """Return a job name with its varying parts stripped: ``llama7b-endpoint-3f9a2c`` → ``llama#b-endpoint-#``.

    Kept for the 65,536 newest names: every sweep asks it of every running job, and a job's name stays."""
    parts = _TOKEN.split(str(name or "").lower())
    out = []
    for p in parts:
        if not p or _TOKEN.fullmatch(p):
            out.append(p)
        elif _HEXISH.match(p) or p.isdigit():
            out.append("#")
        else:
            out.append(re.sub(r"\d+", "#", p))
    return "".join(out)


def class_keys(job: Job, gpus: int) -> tuple[str, str, str]:
    """Return ``(fine key, coarse key, stem)`` of a job holding ``gpus`` GPUs."""
    stem = name_stem(job.name)
    fine = f"user={job.user}|account={job.account}|partition={job.partition}|name={stem}|gpus={gpus}"
    coarse = f"account={job.account}|partition={job.partition}|gpus={gpus}"
    return fine, coarse, stem


def _alone_cpu(snapshot: Snapshot) -> dict[str, float]:
    """Return job id → its node's CPU % (node_exporter) for the running jobs that have a node to themselves."""
    jobs_on: dict[str, int] = {}
    running = snapshot.running_jobs()
    for j in running:
        for n in set(j.nodes or [h for h, _ in j.gpu_alloc]):
            jobs_on[n] = jobs_on.get(n, 0) + 1
    cpu = {n.name: float(n.cpu_util) for n in snapshot.nodes if n.cpu_util is not None and n.cpu_util == n.cpu_util}
    out = {}
    for j in running:
        names = sorted(set(j.nodes or [h for h, _ in j.gpu_alloc]))
        if names and all(jobs_on.get(n) == 1 and n in cpu for n in names):
            out[j.job_id] = sum(cpu[n] for n in names) / len(names)
    return out


def _job_state(snapshot: Snapshot, policy: Policy) -> dict[str, tuple[int, bool, bool, bool]]:
    """Return job id → (GPUs seen, active, idle, memory resident) from the snapshot's window, every job at once.

    A GPU with a stale or missing window is not fresh; a job is active when a fresh GPU is at the idle
    threshold or above, idle when every GPU is fresh and none is, and resident when idle with every GPU's
    least memory above the zombie floor or not measured.
    """
    g = snapshot.columns()
    if g.empty or "job_id" not in g:
        return {}
    thr = policy.rules.idle_allocation.util_max
    index = job_index(snapshot)
    umax = g.get("util_max", float)
    unfresh = g.get("stale", bool) | np.isnan(umax)
    mem = g.get("mem_min_mib", float)
    with np.errstate(invalid="ignore"):
        active = index.any(~unfresh & (umax >= thr))
        # memory not measured (NaN: a trace of utilisation alone) counts as held, as the rules' confidence counts it:
        # a service must not lose its class's protection for a metric the exporter lacks
        held = (mem > policy.rules.zombie.mem_min_mib) | np.isnan(mem)
    idle = ~index.any(unfresh) & ~active
    resident = idle & ~index.any(~held)
    sizes = index.sizes()
    return {jid: (int(sizes[k]), bool(active[k]), bool(idle[k]), bool(resident[k])) for jid, k in index.code.items()}


def observe(store: Any, snapshot: Snapshot, policy: Policy, *, run_id: str | None = None,
            learn: bool = True, only: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """Update the class members with ``snapshot`` and set ``snapshot.classes``; return it.

    ``learn=False`` reads the baselines without recording this snapshot (a manual reclaim: what
    the sweeps learnt decides, one request teaches nothing). With ``baselines.enabled`` false
    nothing is learnt and ``snapshot.classes`` stays empty (the rules then judge each job alone).
    ``only``: the ids of the jobs to observe (a shard of the sweep observes the jobs it judges).
    """
    cfg = policy.baselines
    if not cfg.enabled:
        snapshot.classes = {}
        return {}
    now = float(snapshot.ts)
    state = _job_state(snapshot, policy)
    jobs = [j for j in snapshot.running_jobs() if j.job_id in state and (only is None or j.job_id in only)]
    if not jobs:
        snapshot.classes = {}
        return {}
    known = _known(store)
    known.refresh(store)
    old = known.of_jobs(store, [j.job_id for j in jobs])
    step = float(policy.sweep.interval)
    cpu = _alone_cpu(snapshot)
    rows = []
    for job in jobs:
        n, active, idle, resident = state[job.job_id]
        fine, coarse, stem = class_keys(job, n)
        prev = old.get(job.job_id)
        if prev is not None and float(prev["data_ts"]) >= now:
            rows.append(dict(prev))  # this instant was counted already (a retried sweep)
            continue
        row = _advance(prev, job, now, step, cfg, active=active, idle=idle, resident=resident,
                       cpu=cpu.get(job.job_id))
        row.update(job_id=job.job_id, class_key=fine, coarse_key=coarse, user_name=job.user, account=job.account,
                   partition_name=job.partition, stem=stem, gpus=n, start_ts=job.start_ts, run_id=run_id,
                   data_ts=now)
        rows.append(row)
    if learn:
        written = [r for r in rows if float(r["data_ts"]) == now]
        store.execute("upsert_class_members", written)
        known.wrote(store, written)
    fine_keys = {str(r["class_key"]) for r in rows}
    coarse_keys = {str(r["coarse_key"]) for r in rows}
    slots = known.of_classes(store, fine_keys, coarse_keys, now - cfg.forget_after)
    table, fine_of, coarse_of = known.columns(slots, rows)  # this sweep's view of its own jobs, written or not
    wanted = {("fine", k) for k in fine_keys} | {("coarse", k) for k in coarse_keys}
    stats = class_stats(table, fine_of, coarse_of, known.class_names, now, cfg, step, wanted, known.numbers)
    classes = {}
    for r in rows:
        fine_stats = stats.get(("fine", str(r["class_key"])))
        chosen = (fine_stats if fine_stats and fine_stats["members"] >= cfg.min_members
                  else stats.get(("coarse", str(r["coarse_key"]))) or fine_stats)
        out = dict(chosen or {"key": r["class_key"], "members": 1, "kind": "unknown"})
        out.update(_member_view(r, cfg))
        classes[str(r["job_id"])] = out
    snapshot.classes = classes
    return classes


def _advance(prev: Mapping[str, Any] | None, job: Job, now: float, step: float, cfg: BaselinesConfig, *,
             active: bool, idle: bool, resident: bool, cpu: float | None = None) -> dict[str, Any]:
    """Return the member's row after one more observation at ``now`` (``cpu``: its node's CPU %, when alone)."""
    if prev is None:
        dt = step
        row: dict[str, Any] = {"first_seen": now, "seen_s": 0.0, "active_s": 0.0, "idle_s": 0.0, "idle_mem_s": 0.0,
                               "wakes": 0, "quiet_since": None, "longest_quiet_s": 0.0, "cpu_pct_s": 0.0,
                               "cpu_active_s": 0.0}
    else:
        dt = min(max(0.0, now - float(prev["data_ts"])), 2 * step)
        row = {k: prev.get(k) or 0.0 if k.startswith("cpu_") else prev[k]
               for k in ("first_seen", "seen_s", "active_s", "idle_s", "idle_mem_s", "wakes", "quiet_since",
                         "longest_quiet_s", "cpu_pct_s", "cpu_active_s")}
    row["last_seen"] = now
    if not active and not idle:
        return row  # no fresh data on some GPU: neither busy nor quiet, and no part of a quiet spell
    row["seen_s"] = float(row["seen_s"]) + dt
    quiet = row["quiet_since"]
    if active:
        row["active_s"] = float(row["active_s"]) + dt
        if cpu is not None:
            row["cpu_pct_s"] = float(row["cpu_pct_s"]) + cpu * dt
            row["cpu_active_s"] = float(row["cpu_active_s"]) + dt
        if quiet is not None:
            spell = now - dt - float(quiet)
            row["longest_quiet_s"] = max(float(row["longest_quiet_s"]), spell)
            if spell >= cfg.quiet_gap:
                row["wakes"] = int(row["wakes"]) + 1
        row["quiet_since"] = None
    else:
        if idle:
            row["idle_s"] = float(row["idle_s"]) + dt
            if resident:
                row["idle_mem_s"] = float(row["idle_mem_s"]) + dt
        if quiet is None:
            row["quiet_since"] = now - dt
        else:
            row["longest_quiet_s"] = max(float(row["longest_quiet_s"]), now - float(quiet))
    return row


def _member_view(r: Mapping[str, Any], cfg: BaselinesConfig) -> dict[str, Any]:
    """Return what the class view says about the member itself."""
    idle = float(r["idle_s"] or 0.0)
    seen = float(r["seen_s"] or 0.0)
    resident = float(r["idle_mem_s"] or 0.0) / idle if idle else None
    busy = float(r["active_s"] or 0.0) / seen if seen else None
    service = (int(r["wakes"] or 0) >= cfg.member_min_wakes and resident is not None
               and resident >= cfg.service_min_mem_resident and busy is not None and busy <= cfg.service_max_busy_share)
    return {"member_wakes": int(r["wakes"] or 0), "member_busy_share": _r(busy), "member_mem_resident": _r(resident),
            "member_longest_quiet_s": round(float(r["longest_quiet_s"] or 0.0)),
            "member_kind": "service" if service else None}


def class_stats(table: np.ndarray, fine: np.ndarray, coarse: np.ndarray, names: Sequence[tuple[str, str]],
                now: float, cfg: BaselinesConfig, step: float,
                wanted: Collection[tuple[str, str]] | None = None,
                numbers: Mapping[tuple[str, str], int] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """Return ``(level, key)`` → the class baseline over the members' columns (see the module docstring).

    ``table`` has a row per member, in member order (columns :data:`_FIGURES`, NULL as NaN; changed here);
    ``fine`` and ``coarse`` are each member's two class numbers, ``names[number]`` being the class's
    ``(level, key)`` (:meth:`_Known.columns` gives all three). Each class's sums and counts are taken for all
    classes at once (``np.bincount`` over the members' class numbers): a sweep reads thousands of members in
    hundreds of classes. A class is described when it has members; ``wanted``: only these classes (a sweep needs
    its running jobs' classes, not the fine classes of members it read for their coarse one); ``numbers``: each
    class's number (its place in ``names``), where the caller keeps them: the wanted classes are then found by number
    instead of among every class with members.
    """
    out: dict[tuple[str, str], dict[str, Any]] = {}
    n = len(table)
    if not n:
        return out
    n_classes = len(names)
    group = np.concatenate([fine, coarse])
    # a missing or NULL figure is 0; a run with no start: its first sight
    table[:, :-1] = np.nan_to_num(table[:, :-1], nan=0.0)

    def col(name: str) -> np.ndarray:
        return table[:, _FIGURES.index(name)]

    def per_class(values: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=np.concatenate([values, values]), minlength=n_classes)

    lam = math.log(2) / cfg.half_life
    last_seen = col("last_seen")
    w = np.exp(-lam * np.maximum(0.0, now - last_seen))
    seen_w = per_class(w * col("seen_s"))
    active_w = per_class(w * col("active_s"))
    idle_w = per_class(w * col("idle_s"))
    resident_w = per_class(w * col("idle_mem_s"))
    start = col("start_ts")
    age = last_seen - np.where(np.isnan(start), col("first_seen"), start)
    long_lived = age >= cfg.long_lived
    woke = col("wakes") >= 1
    ended = last_seen < now - 2 * step
    cpu_active = col("cpu_active_s")
    count = np.bincount(group, minlength=n_classes)
    n_long = per_class(long_lived.astype(float))
    woke_long = per_class((woke & long_lived).astype(float))
    n_ended = per_class(ended.astype(float))
    cpu_s = per_class(cpu_active)
    cpu_members = per_class((cpu_active > 0).astype(float))
    cpu_pct_s = per_class(col("cpu_pct_s"))
    gpus_sum = per_class(col("gpus"))
    # a young class (cold start): its running members seen at least baselines.cold_start, each counting once
    oldest = np.full(n_classes, -np.inf)
    np.maximum.at(oldest, group, np.concatenate([age, age]))
    seen_s, idle_s = col("seen_s"), col("idle_s")
    cold = ~ended & (seen_s >= cfg.cold_start) & (seen_s > 0) if cfg.cold_start > 0 else np.zeros(n, dtype=bool)
    cold_n = per_class(cold.astype(float))
    cold_busy = per_class(np.where(cold, col("active_s") / np.where(seen_s > 0, seen_s, 1.0), 0.0))
    cold_idle = cold & (idle_s > 0)
    cold_res_n = per_class(cold_idle.astype(float))
    cold_res = per_class(np.where(cold_idle, col("idle_mem_s") / np.where(idle_s > 0, idle_s, 1.0), 0.0))
    cold_woke = per_class((cold & woke).astype(float))
    # the classes described: those with members (and wanted), in class-number order; each figure below is taken for
    # all of them at once, and a figure with nothing to divide by is None
    if wanted is not None and numbers is not None:
        chosen = sorted(g for g in {numbers.get(w, -1) for w in wanted} if g >= 0 and count[g])
    else:
        chosen = [g for g in np.flatnonzero(count).tolist() if wanted is None or names[g] in wanted]
    if not chosen:
        return out
    pick = np.array(chosen, dtype=np.int64)
    members_n = count[pick]
    long_n = n_long[pick]
    with np.errstate(divide="ignore", invalid="ignore"):
        busy, has_busy = active_w[pick] / seen_w[pick], seen_w[pick] != 0
        res, has_res = resident_w[pick] / idle_w[pick], idle_w[pick] != 0
        waking, has_waking = woke_long[pick] / long_n, long_n != 0
        cpu_pct, has_cpu = cpu_pct_s[pick] / cpu_s[pick], cpu_s[pick] != 0
        gpus_mean = gpus_sum[pick] / members_n
    gpus_mean[gpus_mean == 0] = 1.0
    enough = members_n >= cfg.min_members
    service = (enough & (long_n >= cfg.min_members) & has_busy & (busy <= cfg.service_max_busy_share) & has_res
               & (res >= cfg.service_min_mem_resident) & has_waking & (waking >= cfg.service_min_waking_share))
    training = ~service & enough & has_busy & (busy >= TRAINING_MIN_BUSY)
    # a young class (cold start): judged by what its members did in the hours seen (each member once), not unknown
    # until days pass
    young = (~service & ~training & (long_n < cfg.min_members) & (oldest[pick] < cfg.long_lived)
             & (cold_n[pick] >= cfg.min_members))
    with np.errstate(divide="ignore", invalid="ignore"):
        busy = np.where(young, cold_busy[pick] / cold_n[pick], busy)
        res = np.where(young, cold_res[pick] / cold_res_n[pick], res)
        waking = np.where(young, cold_woke[pick] / cold_n[pick], waking)
    has_busy |= young
    has_waking |= young
    has_res = np.where(young, cold_res_n[pick] != 0, has_res)
    service |= (young & (busy <= cfg.service_max_busy_share) & has_res & (res >= cfg.service_min_mem_resident)
                & (waking >= cfg.service_min_waking_share))
    training |= young & ~service & (busy >= TRAINING_MIN_BUSY)
    kinds = np.where(service, "service", np.where(training, "training", "unknown")).tolist()
    p50, p90 = _class_quantiles(np.concatenate([age, age]), group, np.concatenate([ended, ended]), pick, n_classes)
    cpu_per_gpu = cpu_pct / gpus_mean

    def some(values: np.ndarray, present: np.ndarray) -> list[float | None]:
        return [v if ok else None for v, ok in zip(values.tolist(), present.tolist(), strict=True)]

    for g, m, lng, kind, b, rs, w, yg, old, q50, q90, e, cp, cm, cg in zip(
            chosen, members_n.tolist(), long_n.tolist(), kinds, some(busy, has_busy), some(res, has_res),
            some(waking, has_waking), young.tolist(), oldest[pick].tolist(), p50, p90, n_ended[pick].tolist(),
            some(cpu_pct, has_cpu), cpu_members[pick].tolist(), cpu_per_gpu.tolist(), strict=True):
        level, key = names[g]
        out[(level, key)] = {
            "key": key, "level": level, "members": int(m), "long_lived": int(lng), "kind": kind,
            "busy_share": _r(b), "mem_resident_share": _r(rs), "waking_share": _r(w),
            #: seconds of history behind a young class's figures (cold start), None for a class judged over days
            "cold_start_s": round(old) if yg else None,
            "runtime_p50_s": q50, "runtime_p90_s": q90,
            "ended": int(e),
            #: the node's CPU % while the GPUs were active, on nodes the members had alone, and per GPU
            "cpu_pct_active": _r(cp), "cpu_members": int(cm),
            "cpu_pct_per_gpu": _r(cg) if cp is not None else None,
        }
    return out


#: a member's figures :func:`class_stats` reads, in its table's column order (``start_ts`` last: it may be NULL)
_FIGURES = ("last_seen", "first_seen", "seen_s", "active_s", "idle_s", "idle_mem_s", "wakes", "cpu_active_s",
            "cpu_pct_s", "gpus", "start_ts")
_figures = operator.itemgetter(*_FIGURES)


def _class_quantiles(age: np.ndarray, group: np.ndarray, ended: np.ndarray, pick: np.ndarray,
                     n_classes: int) -> tuple[list[int | None], list[int | None]]:
    """Return, per class of ``pick``, the median and the 90th percentile of its ended members' ages, rounded to whole
    seconds (None: no ended member), every class at once from one sort of the ended ages by class and age.

    ``age``, ``group`` and ``ended`` are per member and class, as :func:`class_stats` lays them out (an age is never
    NaN there: a NULL figure reads 0, a missing start the member's first sight). The interpolation is
    :func:`numpy.quantile`'s linear one, step for step (its own lerp), without its per-call overhead.
    """
    described = np.zeros(n_classes, dtype=bool)
    described[pick] = True
    keep = ended & described[group]  # only the described classes' runs are sorted
    if not keep.any():
        return [None] * len(pick), [None] * len(pick)
    age, group = age[keep], group[keep]
    order = np.lexsort((age, group))
    age, group = age[order], group[order]
    bounds = np.searchsorted(group, np.arange(n_classes + 1))
    lo, hi = bounds[pick], bounds[pick + 1]
    n = hi - lo
    out: list[list[int | None]] = []
    for q in (0.5, 0.9):
        virtual = (n - 1) * q
        below = np.floor(virtual).astype(np.int64)
        a, b, top = (age[np.clip(at, 0, len(age) - 1)] for at in (lo + below, lo + below + 1, hi - 1))
        t = virtual - below
        diff = b - a
        value = np.where(below >= n - 1, top, np.where(t >= 0.5, b - diff * (1 - t), a + diff * t))
        out.append([None if k == 0 else round(v) for k, v in zip(n.tolist(), value.tolist(), strict=True)])
    return out[0], out[1]


def describe(klass: Mapping[str, Any] | None) -> str:
    """Return a class baseline in plain words (notices, ``gpu-cost audit``)."""
    if not klass:
        return "no class baseline yet"
    kind = klass.get("kind") or "unknown"
    parts = [f"class {klass.get('key')} ({klass.get('members')} member(s)): {kind}"]
    if klass.get("cold_start_s") is not None:
        parts.append(f"a young class, learnt from its running members over {float(klass['cold_start_s']) / 3600:.1f} h")
    if klass.get("busy_share") is not None:
        parts.append(f"busy {100 * float(klass['busy_share']):.0f} % of the time")
    if klass.get("waking_share") is not None:
        parts.append(f"{100 * float(klass['waking_share']):.0f} % of its long-lived members woke from quiet spells")
    if klass.get("mem_resident_share") is not None:
        parts.append(f"memory resident {100 * float(klass['mem_resident_share']):.0f} % of the quiet time")
    if klass.get("cpu_pct_per_gpu") is not None:
        parts.append(f"CPU {float(klass['cpu_pct_active']):.0f} % of its node while busy "
                     f"({float(klass['cpu_pct_per_gpu']):.1f} % per GPU)")
    if klass.get("member_kind") == "service":
        parts.append(f"this job woke {klass.get('member_wakes')} time(s) from quiet spells itself")
    return "; ".join(parts)


def is_service(klass: Mapping[str, Any] | None) -> bool:
    """True when the class, or the member itself, behaves like a service."""
    return bool(klass) and (klass.get("kind") == "service" or klass.get("member_kind") == "service")  # type: ignore[union-attr]


class _Known:
    """The class members one process has read or written, so that its later sweeps read only what it lacks.

    A replay (or any process sweeping many times over one store) would otherwise read every member
    of its classes back at each sweep: after a week, thousands of rows a sweep, most of the
    replay's time. The store stays the truth: a class is read whole the first time a sweep needs
    it (again when a sweep asks further back than it was read); the rows this process writes are
    kept as the store gives them back (times at its precision) and under the store's own rule (a
    row replaces one only for a later instant); and each sweep first reads the rows written for a
    later instant than any this process has seen, so another writer's newer rows are taken in.
    What it keeps is forgotten when another store object of the same process writes members to
    the same database (a test's or a benchmark's second object, at any instant). A writer in
    another process storing rows for an instant this one has already seen is not taken in: the
    sweeps never overlap, and each DAG task is a process of its own.
    """

    def __init__(self) -> None:
        #: the count of member writes to this database, in this process, after this object's last one
        self.writes = 0
        self._forget()

    def _forget(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        #: job id -> the place of its kept row in the columns below: its figures (:data:`_FIGURES`, NULL as NaN),
        #: its fine and coarse class numbers (into ``class_names``) and when the row was put (``put``: a count), so a
        #: sweep takes its members' figures by place instead of reading each member's row again, and finds a class's
        #: members, in the order their rows came, from the class numbers of every place at once
        self.slot: dict[str, int] = {}
        self.figures = np.empty((256, len(_FIGURES)))
        self.fine = np.empty(256, dtype=np.int64)
        self.coarse = np.empty(256, dtype=np.int64)
        self.put = np.empty(256, dtype=np.int64)
        self.puts = 0
        self.class_names: list[tuple[str, str]] = []
        #: (level, key) -> its number: its place in ``class_names``
        self.numbers: dict[tuple[str, str], int] = {}
        #: (level, key) -> the ``since`` the class was read whole with
        self.read: dict[tuple[str, str], float] = {}
        self.newest = -math.inf

    def _put_all(self, rows: Iterable[dict[str, Any]], *, newer_only: bool) -> None:
        """Keep ``rows`` in their order (``newer_only``: a row replaces a kept one only for a later instant); their
        figures go to the columns together."""
        changed: dict[int, tuple[tuple[Any, ...], int, int, int]] = {}  # place -> figures, classes, put (last wins)
        for row in rows:
            jid = str(row["job_id"])
            old = self.rows.get(jid)
            if old is not None and newer_only and float(row["data_ts"]) <= float(old["data_ts"]):
                continue
            self.rows[jid] = row
            k = self.slot.get(jid)
            if k is None:
                k = self.slot[jid] = len(self.slot)
            fine, coarse = self._numbers(row)
            changed[k] = (_figures(row), fine, coarse, self.puts)
            self.puts += 1
            self.newest = max(self.newest, float(row["data_ts"]))
        if not changed:
            return
        while len(self.slot) > len(self.fine):  # full: twice the room
            self.figures = np.concatenate([self.figures, np.empty_like(self.figures)])
            self.fine = np.concatenate([self.fine, np.empty_like(self.fine)])
            self.coarse = np.concatenate([self.coarse, np.empty_like(self.coarse)])
            self.put = np.concatenate([self.put, np.empty_like(self.put)])
        places = np.fromiter(changed, dtype=np.int64, count=len(changed))
        values = list(changed.values())
        self.figures[places] = np.array([v[0] for v in values], dtype=float)
        self.fine[places] = [v[1] for v in values]
        self.coarse[places] = [v[2] for v in values]
        self.put[places] = [v[3] for v in values]

    def refresh(self, store: Any) -> None:
        """Take in the rows another writer stored for a later instant than this process has seen; forget
        everything kept when another store object of this process wrote members to the same database (its
        rows may be for an instant this one has seen already)."""
        if _WRITES.get(store.url, 0) != self.writes:
            self._forget()
            self.writes = _WRITES.get(store.url, 0)
        if self.rows:
            self._put_all(store.fetch("class_members_since", {"since": self.newest}), newer_only=False)

    def wrote(self, store: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """Keep the rows just upserted, as the store kept them."""
        from gpu_cost.audit.store import as_stored

        _WRITES[store.url] = self.writes = _WRITES.get(store.url, 0) + 1
        self._put_all(map(as_stored, rows), newer_only=True)

    def of_jobs(self, store: Any, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Return job id → its member row, reading the store for the jobs not kept."""
        missing = [j for j in job_ids if j not in self.rows]
        for i in range(0, len(missing), 500):
            self._put_all(store.fetch("class_members_of_jobs", {"job_ids": missing[i:i + 500]}), newer_only=False)
        return {j: self.rows[j] for j in job_ids if j in self.rows}

    def of_classes(self, store: Any, fine: set[str], coarse: set[str], since: float) -> np.ndarray:
        """Return the places (in the kept columns) of the members of these classes last seen after ``since``, in the
        classes' order (fine keys sorted, then coarse; a member in both, once, where its fine class puts it), each
        class's members in the order their rows came, reading the classes not read yet."""
        f = sorted(k for k in fine if self.read.get(("fine", k), math.inf) > since)
        c = sorted(k for k in coarse if self.read.get(("coarse", k), math.inf) > since)
        for i in range(0, max(len(f), len(c)), 250):
            self._put_all(store.fetch("class_members_of_classes", {"class_keys": f[i:i + 250] or [""],
                                                                   "coarse_keys": c[i:i + 250] or [""], "since": since}),
                          newer_only=False)
        self.read.update({("fine", k): since for k in f})
        self.read.update({("coarse", k): since for k in c})
        # each class's rank in that order (a class with no number has no member); a place goes where its first
        # class ranks, after the places put before it
        none = len(self.class_names) + 1
        rank = np.full(len(self.class_names), none, dtype=np.int64)
        names = [("fine", k) for k in sorted(fine)] + [("coarse", k) for k in sorted(coarse)]
        for r, name in enumerate(names):
            if (number := self.numbers.get(name)) is not None:
                rank[number] = r
        n = len(self.slot)
        first = np.minimum(rank[self.fine[:n]], rank[self.coarse[:n]])
        slots = np.flatnonzero(first < none)
        slots = slots[np.argsort(first[slots] * (self.puts + 1) + self.put[slots], kind="stable")]
        return slots[self.figures[slots, _FIGURES.index("last_seen")] > since]

    def columns(self, slots: np.ndarray, rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the members' figures and fine and coarse class numbers (:func:`class_stats`' columns): the kept
        rows at ``slots`` in that order, each replaced by ``rows``' row of the same job (this sweep's view, written
        or not), and after them ``rows``' other rows in their order (the members a sweep reads, then its own; with
        no ``slots``, ``rows`` alone, their classes numbered as they first come)."""
        table, fine, coarse = self.figures[slots], self.fine[slots], self.coarse[slots]
        if not rows:
            return table, fine, coarse
        figures = np.array([_figures(r) for r in rows], dtype=float)
        numbers = np.array([self._numbers(r) for r in rows], dtype=np.int64).reshape(len(rows), 2)
        at = np.full(len(self.slot) + 1, -1, dtype=np.int64)  # place -> its position among ``slots`` (the last: none)
        at[slots] = np.arange(len(slots))
        pos = at[np.fromiter((self.slot.get(str(r["job_id"]), -1) for r in rows), dtype=np.int64, count=len(rows))]
        inside = pos >= 0
        table[pos[inside]], fine[pos[inside]], coarse[pos[inside]] = (
            figures[inside], numbers[inside, 0], numbers[inside, 1])
        if not inside.all():
            table = np.concatenate([table, figures[~inside]])
            fine = np.concatenate([fine, numbers[~inside, 0]])
            coarse = np.concatenate([coarse, numbers[~inside, 1]])
        return table, fine, coarse

    def _numbers(self, row: Mapping[str, Any]) -> tuple[int, int]:
        """Return a member row's fine and coarse class numbers (numbering a class not seen yet)."""
        numbers = []
        for name in (("fine", str(row["class_key"])), ("coarse", str(row["coarse_key"]))):
            k = self.numbers.get(name)
            if k is None:
                k = self.numbers[name] = len(self.class_names)
                self.class_names.append(name)
            numbers.append(k)
        return numbers[0], numbers[1]


#: store -> what this process knows of its class members
_KNOWN: weakref.WeakKeyDictionary[Any, _Known] = weakref.WeakKeyDictionary()
#: database URL -> how many times this process has written class members to it (through any store object)
_WRITES: dict[str, int] = {}


def _known(store: Any) -> _Known:
    found = _KNOWN.get(store)
    if found is None:
        found = _KNOWN[store] = _Known()
    return found


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 3)
