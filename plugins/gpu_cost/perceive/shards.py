"""Shards of one sweep: the cluster's nodes split into groups that are collected and detected apart.

A very large cluster is swept in ``sweep.shards`` node groups, each collected and run through the
rules on its own worker; the findings of every group then go to ONE decision (one engine, caps
counted once). A node belongs to the group :func:`shard_of` its name says (a stable hash, so
every task of a run, and every run, puts it in the same group without being told the list).

The findings of a sharded sweep are those of the unsharded one. A group does not see only its own
nodes: :func:`select` widens it to what its findings need, and :func:`owned` keeps only the
findings the group answers for.

- A job belongs to the group of the first of its nodes (sorted by name; a job on no node, such as
  a pending one, to the group its id hashes to); a reservation to the group of the first of its
  nodes. A process or GPU finding belongs to the group of its host (a finding of another kind: of
  its first node); a finding that names none is an error.
- The group's view holds every GPU of the jobs that touch its nodes or belong to it, every job
  on those nodes (whether another job shares a node changes a verdict), the jobs that run or wait
  in its reservations, the jobs its processes name and the jobs that belong to it: each job it
  judges is seen whole, as the unsharded sweep sees it. The queue is not every group's: a pending
  job is in its own group's view (and in the view of the group judging its reservation), so 16
  groups do not each carry, store and read back a 100,000-job queue.
- :func:`merge` puts the groups' own rows back together into the run's snapshot (each GPU,
  process, node and job exactly once), which the decision, the audit and the acting steps read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.model import Finding, Job, Reservation, Snapshot
from gpu_cost.core.perf import gc_paused

#: Airflow's ``[core] max_map_length``: a mapped task cannot have more instances
MAX_SHARDS = 1024


def shard_of(name: str, of: int) -> int:
    """Return the group (0 … ``of`` - 1) of a node name (or any key): a stable hash, the same on every worker."""
    if of <= 1:
        return 0
    # a cryptographic digest, not crc32: node names differ in a digit or two, and crc32 of such names
    # falls into few residues for small counts (gpu01..gpu03 all even)
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") % of


def check(shard: int, of: int) -> None:
    if not 1 <= of <= MAX_SHARDS or not 0 <= shard < of:
        raise GpuCostError(f"shard {shard} of {of}: a sweep has 1 to {MAX_SHARDS} shards, numbered from 0")


def snapshot_key(run_id: str, shard: int, of: int) -> str:
    """Return the key a group's snapshot is stored under in the audit store (the run's own key unsharded)."""
    return run_id if of == 1 else f"{run_id}#shard-{shard}-of-{of}"


def job_hosts(job: Job) -> set[str]:
    return set(job.nodes) | {h for h, _ in job.gpu_alloc}


def job_owner(job: Job, of: int) -> int:
    """Return the group that judges ``job``: its first node's (a job on no node: its id's)."""
    hosts = job_hosts(job)
    return shard_of(min(hosts) if hosts else f"job:{job.job_id}", of)


def reservation_owner(r: Reservation, of: int) -> int:
    return shard_of(min(r.nodes) if r.nodes else f"reservation:{r.name}", of)


@dataclass(frozen=True)
class Selection:
    """What group ``shard`` of ``of`` looks at (``hosts``, ``jobs``) and answers for (``own``, ``owned_*``)."""

    shard: int
    of: int
    #: the group's own nodes: their GPUs, processes and nodes are merged back from this group alone
    own: frozenset[str]
    #: every node the group's view holds
    hosts: frozenset[str]
    #: ids of the jobs the view holds
    jobs: frozenset[str]
    #: ids of the jobs the group judges
    owned_jobs: frozenset[str]
    #: names of the reservations the group judges
    owned_reservations: frozenset[str]


def select(hosts: Iterable[str], jobs: Sequence[Job], reservations: Sequence[Reservation], shard: int,
           of: int) -> Selection:
    """Return what group ``shard`` of ``of`` must see of a cluster with these nodes, jobs and reservations."""
    check(shard, of)
    all_hosts = set(hosts) | {h for j in jobs for h in job_hosts(j)} | {h for r in reservations for h in r.nodes}
    own = {h for h in all_hosts if shard_of(h, of) == shard}
    running = [j for j in jobs if j.running]
    owned_res = {r.name for r in reservations if r.active and reservation_owner(r, of) == shard}
    res_nodes = {h for r in reservations if r.name in owned_res for h in r.nodes}
    # the jobs touching the group's nodes or running in its reservations are seen whole ...
    first = [j for j in running if job_hosts(j) & (own | res_nodes) or (j.reservation and j.reservation in owned_res)]
    wide = own | res_nodes | {h for j in first for h in job_hosts(j)}
    # ... with every job that shares a node with them (a job alone on its node is judged otherwise), seen whole too
    second = [j for j in running if job_hosts(j) & wide]
    view_hosts = wide | {h for j in second for h in job_hosts(j)}
    owned = {j.job_id for j in running if job_owner(j, of) == shard}
    # a job that does not run: in its own group's view, and in that of the group judging its reservation
    waiting = {j.job_id for j in jobs if not j.running and (
        (j.reservation and j.reservation in owned_res) or job_owner(j, of) == shard)}
    ids = {j.job_id for j in second} | owned | waiting
    return Selection(shard=shard, of=of, own=frozenset(own), hosts=frozenset(view_hosts), jobs=frozenset(ids),
                     owned_jobs=frozenset(owned), owned_reservations=frozenset(owned_res))


def select_in(snapshot: Snapshot, shard: int, of: int) -> Selection:
    """Return :func:`select` for the cluster ``snapshot`` shows."""
    hosts = set(snapshot.gpus["host"].astype(str)) if len(snapshot.gpus) else set()
    hosts |= {n.name for n in snapshot.nodes} | {p.host for p in snapshot.processes}
    return select(hosts, snapshot.jobs, snapshot.reservations, shard, of)


def widen(sel: Selection, job_ids: Iterable[str]) -> Selection:
    """Return ``sel`` holding the jobs ``job_ids`` too (jobs the processes on its nodes name)."""
    extra = frozenset(job_ids) - sel.jobs
    return replace(sel, jobs=sel.jobs | extra) if extra else sel


def restrict(snapshot: Snapshot, sel: Selection) -> Snapshot:
    """Return the part of ``snapshot`` group ``sel`` sees (a view: the GPU frames are filtered copies)."""
    procs = tuple(p for p in snapshot.processes if p.host in sel.hosts)
    sel = widen(sel, (p.job_id for p in procs if p.job_id))
    mask = snapshot.gpus["host"].astype(str).isin(sel.hosts).to_numpy() if len(snapshot.gpus) else None
    gpus = snapshot.gpus if mask is None else snapshot.gpus[mask].reset_index(drop=True)
    windows = {w: (f if mask is None else f[mask].reset_index(drop=True)) for w, f in snapshot.windows.items()}
    return replace(
        snapshot, gpus=gpus, windows=windows,
        jobs=tuple(j for j in snapshot.jobs if j.job_id in sel.jobs),
        processes=procs,
        nodes=tuple(n for n in snapshot.nodes if n.name in sel.hosts),
        disagreements=tuple(d for d in snapshot.disagreements if d.host in sel.hosts),
        job_logs={k: v for k, v in snapshot.job_logs.items() if k in sel.jobs},
        classes={k: v for k, v in snapshot.classes.items() if k in sel.jobs},
        reservations=tuple(r for r in snapshot.reservations if r.name in sel.owned_reservations),
    )


def owned(findings: Iterable[Finding], sel: Selection) -> list[Finding]:
    """Return the findings group ``sel`` answers for (the others are another group's, seen in part)."""
    out = []
    for f in findings:
        if f.target_kind == "job":
            mine = (f.job_id or f.target.split(":", 1)[-1]) in sel.owned_jobs
        elif f.target_kind == "reservation":
            mine = f.target.split(":", 1)[-1] in sel.owned_reservations
        elif f.host is not None or f.nodes:
            mine = (f.host or min(f.nodes)) in sel.own
        else:
            raise GpuCostError(f"finding {f.rule} {f.target}: a {f.target_kind} finding names no host, "
                               "so no shard can answer for it")
        if mine:
            out.append(f)
    return out


def merge_findings(parts: Iterable[Iterable[Finding]]) -> list[Finding]:
    """Return the groups' findings as one list, in the order the rules give them (most GPUs first)."""
    out = [f for part in parts for f in part]
    out.sort(key=lambda f: (-f.gpus, f.rule, f.target))
    return out


@gc_paused()
def merge(parts: Sequence[tuple[Selection, Snapshot]]) -> Snapshot:
    """Return the run's snapshot from its groups' views: each group's own nodes, every job once."""

    if not parts:
        raise GpuCostError("no shard snapshots to merge")
    first = parts[0][1]
    if len({(s.ts, s.source) for _, s in parts}) > 1:
        raise GpuCostError("shard snapshots of different instants or sources cannot be merged")
    frames, windows_parts = [], []
    procs, nodes, disagreements = [], [], []
    reservations: dict[str, Reservation] = {}
    problems: list[str] = []
    job_logs: dict[str, dict[str, Any]] = {}
    classes: dict[str, dict[str, Any]] = {}
    # each running job is judged by one group, whose view holds it; a job that does not run is in its own
    # group's view and at most a few others (select): so every job once, each view walked once
    jobs: dict[str, Job] = {}
    for sel, snap in parts:
        mask = snap.gpus["host"].astype(str).isin(sel.own).to_numpy() if len(snap.gpus) else None
        frames.append(snap.gpus if mask is None else snap.gpus[mask])
        windows_parts.append({w: (f if mask is None else f[mask]) for w, f in snap.windows.items()})
        for j in snap.jobs:
            if j.job_id in sel.owned_jobs or not j.running:
                jobs.setdefault(j.job_id, j)
        procs += [p for p in snap.processes if p.host in sel.own]
        nodes += [n for n in snap.nodes if n.name in sel.own]
        disagreements += [d for d in snap.disagreements if d.host in sel.own]
        for r in snap.reservations:
            reservations.setdefault(r.name, r)
        problems += [p for p in snap.problems if p not in problems]
        job_logs.update(_within(snap.job_logs, sel.jobs))
        classes.update(_within(snap.classes, sel.owned_jobs))
    gpus = _whole(frames) if frames else first.gpus
    order = gpus.sort_values(["host", "gpu"], kind="stable").index.to_numpy() if len(gpus) else None
    gpus = gpus if order is None else gpus.loc[order].reset_index(drop=True)
    windows: dict[float, Any] = {}
    for w in first.windows:
        cat = _whole([p[w] for p in windows_parts if w in p])
        windows[w] = cat if order is None else cat.loc[order].reset_index(drop=True)
    return replace(
        first, gpus=gpus, windows=windows, jobs=tuple(jobs.values()),
        processes=tuple(sorted(procs, key=lambda p: (p.host, p.pid))),
        nodes=tuple(sorted(nodes, key=lambda n: n.name)),
        disagreements=tuple(disagreements), problems=tuple(problems), job_logs=job_logs, classes=classes,
        reservations=tuple(reservations.values()),
    )


def _within(d: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    """Return the items of ``d`` whose key is in ``keys``, walking whichever of the two is smaller."""
    if len(keys) < len(d):
        return {k: d[k] for k in sorted(keys) if k in d}  # sorted: a set's order changes with the process
    return {k: v for k, v in d.items() if k in keys}


#: columns a GPU frame has only when some row needs them, and what a row of a group without them holds
_OPTIONAL = {"mig": "", "mig_profile": "", "mig_uuid": "", "share": 1.0, "sharers": ""}


def _whole(frames: list[Any]) -> Any:
    """Concatenate the groups' frames as the whole cluster's frame would be: the optional columns some
    groups lacked filled as a row without them holds, in the column order of the widest group's frame."""
    import pandas as pd

    frame = pd.concat(frames, ignore_index=True)
    widest = list(max(frames, key=lambda f: len(f.columns)).columns)
    frame = frame[widest + [c for c in frame.columns if c not in widest]]
    for col, absent in _OPTIONAL.items():
        if col in frame and frame[col].isna().any():
            frame[col] = frame[col].where(frame[col].notna(), absent)
    return frame


def of_view(view: Snapshot, shard: int, of: int) -> Selection:
    """Return the :class:`Selection` a group's stored view was cut with (a view holds all it needs to say)."""
    check(shard, of)
    running = view.running_jobs()
    hosts = set(view.gpus["host"].astype(str)) if len(view.gpus) else set()
    hosts |= {n.name for n in view.nodes} | {p.host for p in view.processes}
    hosts |= {h for j in running for h in job_hosts(j)}
    group = {h: shard_of(h, of) for h in hosts}  # each node hashed once: a job's owner is its first node's group

    def judged(j: Job) -> bool:
        on = job_hosts(j)
        return (group[min(on)] if on else job_owner(j, of)) == shard

    return Selection(
        shard=shard, of=of, own=frozenset(h for h, g in group.items() if g == shard), hosts=frozenset(hosts),
        jobs=frozenset(j.job_id for j in view.jobs),
        owned_jobs=frozenset(j.job_id for j in running if judged(j)),
        owned_reservations=frozenset(r.name for r in view.reservations if r.active and reservation_owner(r, of) == shard),
    )
