"""Replica sets: the running jobs that are copies of one service, recognised by what they are.

A serving deployment runs the same model N times (``llm-serve-3``, ``llm-serve-7f9c2``...) behind
a load balancer. Judged one at a time, a replica the balancer starves for a day looks exactly
like an abandoned job: GPUs idle, the model resident. Judged beside its siblings it is spare
capacity of a service that is working, and the right answer is advice to size the set, never a
kill of the one replica (whether or not a protection or an ``inference:`` pattern names it).

A *replica set* (``replicas:`` in the policy) is ``min_members`` or more running jobs of

* one owner,
* one name stem: the name with its trailing replica indices and hashes stripped
  (:func:`replica_stem`: ``llm-serve-3`` and ``llm-serve-7f9c2`` are both ``llm-serve``),
* the same resident memory per GPU (the least framebuffer used over the rule window, the model's
  footprint) within ``mem_tolerance`` of the larger, above ``rules.zombie.mem_min_mib``; where no GPU
  of the members has its memory measured (a trace of utilisation alone, an exporter without the
  framebuffer metric), the same number of GPUs instead: nothing says the model is not resident, and
  memory not measured counts as memory held (:func:`gpu_cost.analyse.evidence.confidence`),

all seen fresh in the snapshot now (side by side). The set *serves* when a member was busy
(at or above ``rules.idle_allocation.util_max``) within the lookback, or its class baseline saw
it wake from a quiet spell. Its evidence lists the set: its size, its members busy now (in the
rule window), and its peak — the most members busy in one twelfth of the lookback (the notices'
chart buckets) — and the advice: the replicas that peak needs with ``headroom``.

Everything is read from the snapshot the rules get (the GPU frame's window and lookback columns,
the class baselines in ``snapshot.classes``): no I/O, and nothing when no rule asks.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpu_cost.analyse.jobrows import JobRows, job_index
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Snapshot
from gpu_cost.perceive.snapshot import chart_values

_SEP = re.compile(r"([-_.]+)")
#: what Kubernetes generates for a pod's name: a template hash and a suffix in an alphabet without vowels
_K8S_TOKEN = re.compile(r"^[bcdfghjklmnpqrstvwxz2456789]{5,10}$")


def _replica_suffix(token: str) -> bool:
    """True for a token that numbers or hashes a replica: digits; four or more letters and digits with a
    digit; or five to ten characters of Kubernetes' generated-name alphabet (no vowels: no word)."""
    return (token.isdigit() or (len(token) >= 4 and token.isalnum() and any(c.isdigit() for c in token))
            or bool(_K8S_TOKEN.match(token)))


@functools.lru_cache(maxsize=65536)
def replica_stem(name: str) -> str:
    """Return a job name without its trailing replica indices and hashes: ``llm-serve-7f9c2-x2k4p`` → ``llm-serve``.

    A name that is nothing but an index keeps it (``7`` stays ``7``): a stem is never empty. Kept for the 65,536
    newest names: every sweep asks it of every running job.
    """
    parts = _SEP.split(str(name or "").strip().lower())
    while len(parts) >= 3 and _replica_suffix(parts[-1]):
        del parts[-2:]  # the token and the separator before it
    return "".join(parts)


@dataclass(frozen=True)
class ReplicaSet:
    """One replica set as a sweep sees it.

    :param key: ``owner|stem``
    :param members: the members' job ids, sorted
    :param footprint_mib: the members' median resident memory per GPU (None: memory not measured)
    :param busy_now: the members busy in the rule window
    :param serving: the members busy within the lookback (or that woke, per their class baseline)
    :param peak_busy: the most members busy in one bucket of the lookback (None: no chart)
    :param needed: the replicas ``peak_busy`` needs with the policy's headroom (None: no chart)
    """

    key: str
    owner: str
    stem: str
    members: tuple[str, ...]
    footprint_mib: float | None
    busy_now: tuple[str, ...]
    serving: tuple[str, ...]
    peak_busy: int | None
    needed: int | None

    @property
    def size(self) -> int:
        return len(self.members)

    def serves_without(self, job_id: str) -> bool:
        """True when a member other than ``job_id`` serves."""
        return any(m != job_id for m in self.serving)

    def advice(self) -> str:
        """Return the advice for the set, in plain words."""
        if self.needed is None:
            return (f"{len(self.serving)} of its {self.size} replicas served in the lookback; "
                    "size the set to the load it gets instead of stopping one replica")
        if self.needed < self.size:
            return (f"at its peak {self.peak_busy} of {self.size} replicas were busy at once: {self.needed} would carry "
                    f"that with headroom; scale the set to {self.needed} (not stop one replica)")
        return (f"at its peak {self.peak_busy} of {self.size} replicas were busy at once: the set is not oversized; "
                "this replica is idle because little traffic reaches it (check the load balancing)")

    def evidence(self) -> dict[str, Any]:
        """Return the set as a finding's evidence shows it."""
        return {"key": self.key, "owner": self.owner, "stem": self.stem, "size": self.size,
                "members": list(self.members),
                "footprint_mib": None if self.footprint_mib is None else round(self.footprint_mib),
                "busy_now": len(self.busy_now), "serving": len(self.serving), "busy_at_peak": self.peak_busy,
                "needed": self.needed, "advice": self.advice()}

    def describe(self) -> str:
        """Return the set in one line (the finding's ``inference`` reason and its signal)."""
        peak = f", {self.peak_busy} busy at its recent peak" if self.peak_busy is not None else ""
        memory = ("memory not measured" if self.footprint_mib is None else
                  f"{self.footprint_mib / 1024:.1f} GiB resident each")
        return f"one of {self.size} replicas of {self.stem!r} (owner {self.owner}, {memory}): {len(self.busy_now)} busy now{peak}"


def replica_sets(snapshot: Snapshot, policy: Policy) -> dict[str, ReplicaSet]:
    """Return job id → its replica set, for the members of every set in ``snapshot`` (built once per GPU frame)."""
    if not policy.replicas.enabled:
        return {}
    found: dict[str, ReplicaSet] = snapshot.memo("replica_sets", snapshot.gpus, lambda: _build(snapshot, policy))
    return found


def to_json(sets: Mapping[str, ReplicaSet]) -> dict[str, Any]:
    """Return job id → set as plain data (a sharded run keeps the cluster's sets in the audit store)."""
    return {jid: {**asdict(rs), "members": list(rs.members), "busy_now": list(rs.busy_now),
                  "serving": list(rs.serving)} for jid, rs in sets.items()}


def from_json(data: Mapping[str, Any]) -> dict[str, ReplicaSet]:
    """Return the sets :func:`to_json` wrote."""
    return {str(jid): ReplicaSet(**{**d, "members": tuple(d["members"]), "busy_now": tuple(d["busy_now"]),
                                    "serving": tuple(d["serving"])}) for jid, d in data.items()}


def use(snapshot: Snapshot, sets: Mapping[str, ReplicaSet]) -> None:
    """Make ``snapshot`` (one node group's view) judge its jobs by the whole cluster's replica sets.

    A set spans node groups: a member's siblings may sit in another group's view, so a view alone
    would see a smaller set, or none, and could take a replica for a lone idle job.
    """
    cached: dict[str, ReplicaSet] = snapshot.memo("replica_sets", snapshot.gpus, dict)
    cached.clear()
    cached.update(sets)


def spare(snapshot: Snapshot, policy: Policy, job_id: str) -> ReplicaSet | None:
    """Return the set of ``job_id`` when it is a replica whose other members serve (spare capacity), else None."""
    found = replica_sets(snapshot, policy).get(job_id)
    return found if found is not None and found.serves_without(job_id) else None


def _build(snapshot: Snapshot, policy: Policy) -> dict[str, ReplicaSet]:
    g = snapshot.columns()
    if g.empty or "job_id" not in g:
        return {}
    cfg = policy.replicas
    thr = policy.rules.idle_allocation.util_max
    index = job_index(snapshot)
    umax = g.get("util_max", float)
    memmin = g.get("mem_min_mib", float)
    umax_lb = g.get("util_max_lb", float) if "util_max_lb" in g else np.full(len(g), np.nan)
    charts = g.get("util_chart_lb", object) if "util_chart_lb" in g else None
    # per job, every row at once: its footprint, and whether every GPU was seen fresh with something resident
    # (no data, no judgement; nothing resident: no model, no replica)
    footprints = index.median(memmin)
    no_memory = np.isnan(memmin)
    seen = ~index.any(g.get("stale", bool) | np.isnan(umax))
    with np.errstate(invalid="ignore"):
        keep = (seen & ~index.any(no_memory) & ~(footprints <= policy.rules.zombie.mem_min_mib)).tolist()
    # memory measured on none of a job's GPUs: its footprint is not known, so nothing says no model is resident
    unmeasured = (seen & (index.count(no_memory) == index.sizes())).tolist()
    sizes = index.sizes().tolist()
    median = footprints.tolist()
    code_of = index.code
    groups: dict[tuple[str, str, int | None], list[tuple[float, str]]] = {}
    for job in snapshot.running_jobs():
        code = code_of.get(job.job_id)
        if code is None or not (keep[code] or unmeasured[code]) or sizes[code] < sum(len(idx) for _, idx in job.gpu_alloc):
            continue
        # members whose memory is not measured are alike by their number of GPUs instead of their footprint
        shape = sizes[code] if unmeasured[code] else None
        groups.setdefault((job.user, replica_stem(job.name), shape), []).append((median[code], job.job_id))
    found: list[tuple[str, str, list[tuple[float, str]]]] = []
    for (owner, stem, shape), members in groups.items():
        if len(members) < cfg.min_members:
            continue
        if shape is not None:
            found.append((owner, stem, members))
            continue
        members.sort()
        # members with the same footprint: runs where each is within the tolerance of the run's largest
        runs: list[list[tuple[float, str]]] = []
        for item in members:
            if runs and item[0] - runs[-1][0][0] <= cfg.mem_tolerance * item[0]:
                runs[-1].append(item)
            else:
                runs.append([item])
        found.extend((owner, stem, run) for run in runs if len(run) >= cfg.min_members)
    if not found:
        return {}
    busy = (index.reduce(np.maximum, umax) >= thr).tolist()
    busy_lb = (index.reduce(np.maximum, np.nan_to_num(umax_lb, nan=0.0)) >= thr).tolist()
    sets = [tuple(sorted(jid for _, jid in run)) for _, _, run in found]
    peaks = _peaks(sets, index, charts, thr)
    classes = snapshot.classes
    out: dict[str, ReplicaSet] = {}
    for (owner, stem, run), ids, peak in zip(found, sets, peaks, strict=True):
        codes = [code_of[m] for m in ids]
        busy_now = tuple(m for m, k in zip(ids, codes, strict=True) if busy[k])
        serving = tuple(m for m, k in zip(ids, codes, strict=True) if busy[k] or busy_lb[k]
                        or int((classes.get(m) or {}).get("member_wakes") or 0) >= 1)
        if peak is not None:
            peak = max(peak, len(busy_now))
        needed = None if peak is None else max(1, math.ceil(peak * (1.0 + cfg.headroom)))
        footprint = None if math.isnan(run[0][0]) else _median_of_sorted([f for f, _ in run])
        made = ReplicaSet(key=f"{owner}|{stem}", owner=owner, stem=stem, members=ids,
                          footprint_mib=footprint, busy_now=busy_now, serving=serving,
                          peak_busy=peak, needed=needed)
        out.update({jid: made for _, jid in run})
    return out


def _median_of_sorted(values: list[float]) -> float:
    """Return ``statistics.median`` of ``values`` already in ascending order (it would sort them again)."""
    n = len(values)
    return float(values[n // 2]) if n % 2 == 1 else float((values[n // 2 - 1] + values[n // 2]) / 2)


def _peaks(sets: list[tuple[str, ...]], index: JobRows, charts: np.ndarray | None, thr: float) -> list[int | None]:
    """Return per set (its members' job ids) the most members busy in one bucket of the lookback's chart, None where
    it has none; every set at once, each distinct chart text of the sets' GPUs parsed once (a sweep's GPUs repeat
    a few; the other GPUs' charts are not read).

    A member counts with the buckets where one of its GPUs was at ``thr`` or above; a member whose GPUs' charts
    differ in length, or are empty, does not count; a set with no member counted, or whose counted members' charts
    differ in length, has no peak.
    """
    if charts is None or not sets:
        return [None] * len(sets)
    members = np.concatenate([index.rows[m] for s in sets for m in s])
    texts, mine = np.unique(np.array([str(c or "") for c in charts[members]], dtype=object), return_inverse=True)
    which = np.full(len(charts), len(texts))  # another GPU's chart: the empty one after the texts
    which[members] = mine
    parsed = [chart_values(str(t)) if t else () for t in texts] + [()]  # an empty chart is no buckets
    lengths = np.array([len(b) for b in parsed], dtype=float)
    table = np.full((len(parsed), max(1, int(lengths.max()))), np.nan)
    for k, b in enumerate(parsed):
        table[k, :len(b)] = b
    table[table < 0] = np.nan  # a bucket with no data
    # per job: its GPUs' chart length (when they agree) and, per bucket, whether one of its GPUs was busy
    shortest, longest = index.reduce(np.minimum, lengths[which]), index.reduce(np.maximum, lengths[which])
    with np.errstate(invalid="ignore"):
        busy = index.reduce(np.fmax, table[which]) >= thr  # NaN (no data in the bucket on any GPU) is not busy
    counted = (shortest == longest) & (longest > 0)
    # the members of every set, set after set: per set, its counted members' busy buckets summed and their lengths
    codes = np.array([index.code[m] for s in sets for m in s], dtype=np.int64)
    starts = np.cumsum([0] + [len(s) for s in sets[:-1]])
    ok = counted[codes]
    per_bucket = np.add.reduceat((busy[codes] & ok[:, None]).astype(np.int64), starts, axis=0)
    n_counted = np.add.reduceat(ok.astype(np.int64), starts)
    lo = np.minimum.reduceat(np.where(ok, longest[codes], np.inf), starts)
    hi = np.maximum.reduceat(np.where(ok, longest[codes], -np.inf), starts)
    tops = per_bucket.max(axis=1)
    return [int(top) if n and a == b else None for top, n, a, b in
            zip(tops.tolist(), n_counted.tolist(), lo.tolist(), hi.tolist(), strict=True)]
