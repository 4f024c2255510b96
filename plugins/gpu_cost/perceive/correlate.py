"""Join GPUs, processes and jobs into one picture, and say so where the sources disagree.

A GPU is attributed to a job by, in order of trust: the scheduler's allocation (Slurm's GPU
indices on that node), the exporter's job label (dcgm-exporter ``hpc_job``), the cgroup of the
processes on it. When two of them name *different running* jobs the GPU is marked ``conflict``
and the rules leave it alone. Processes are matched to GPUs by UUID first, by index otherwise.
An orphan process (no job, or a job that ended) on a GPU that Slurm allocates to a running job
does not change the attribution but is reported as a disagreement: the job's owner shares the
GPU with a leftover they may not know about. A GPU no source names, on a node where a running
job holds GPUs no source places (an accounting export has no GPU indices), is ``unplaced``, not
``none``: it may be that job's, so it is nobody's zombie.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet

import pandas as pd

from gpu_cost.core.model import Disagreement, GpuProcess, Job

#: an empty set to read, never to change
_NONE: frozenset[str] = frozenset()


def host_names(metric_hosts: Iterable[str], scheduler_hosts: Iterable[str]) -> dict[str, str]:
    """Return ``{a metric series' host: the scheduler's name for it}`` where the two name a node differently.

    An exporter often labels its series with the node's fully qualified name (``gpu01.cluster.example.org``)
    where Slurm says ``gpu01``, or the other way round, or in other letter case (``GPU01``). Matched so, a
    job's GPUs would be nobody's and its node would have no GPU series. A metric host the scheduler does not know is renamed when, in any
    letter case, it is a scheduler node, its first label is one, or it is the first label of exactly one;
    that name is no other metric host's, and no other metric host maps onto it. Everything else is left
    as it is.
    """
    metric = set(metric_hosts)
    known = set(scheduler_hosts)
    if not known or metric <= known:
        return {}
    # host names are case-insensitive (RFC 4343): a node is GPU01 to one source and gpu01 to the other
    full_names: dict[str, list[str]] = defaultdict(list)  # by first label
    exact: dict[str, list[str]] = defaultdict(list)
    for k in known:
        full_names[k.split(".", 1)[0].lower()].append(k)
        exact[k.lower()].append(k)
    out: dict[str, str] = {}
    for h in metric - known:
        short = h.split(".", 1)[0].lower()
        same = exact.get(h.lower(), [])
        if len(same) == 1:
            name: str | None = same[0]
        elif same:
            name = None
        elif short != h.lower():
            shorts = exact.get(short, [])
            name = shorts[0] if len(shorts) == 1 else None
        else:
            fulls = full_names.get(short, [])
            name = fulls[0] if len(fulls) == 1 else None
        if name is not None and name not in metric:
            out[h] = name
    taken = Counter(out.values())
    return {h: name for h, name in out.items() if taken[name] == 1}


def scheduler_hosts(jobs: Iterable[Job], nodes: Iterable[str] = ()) -> set[str]:
    """Return the node names the scheduler uses: its nodes' and those its jobs hold GPUs on."""
    out = set(nodes)
    for j in jobs:
        out.update(h for h, _ in j.gpu_alloc)
        out.update(h for h, _ in j.mig_alloc)
    return out


def attribute(gpus: pd.DataFrame, jobs: Iterable[Job], processes: Iterable[GpuProcess]) -> tuple[pd.DataFrame, list[Disagreement]]:
    """Return ``gpus`` with ``job_id`` and ``attribution`` columns, and the disagreements found.

    A MIG slice (a row with ``mig``) is a device of its own: Slurm's claim on it is the job's
    ``mig_alloc`` (``<gpu>/<gi>`` or the slice's MIG UUID), and the processes on it are those whose
    GPU UUID is the slice's MIG UUID or whose ``mig`` names its instance. A slice no job's
    ``mig_alloc`` names but where the processes of one running job holding GPUs on that node run
    is that job's (``cgroup``): Slurm's MIG gres indices do not say which slice they are.

    A device several running jobs hold (Slurm ``shard``/``mps`` gres, time-slicing: two jobs
    allocated the same GPU, or a job marked ``gpu_shared``) is ``shared``: its ``job_id`` is empty
    and ``sharers`` lists the jobs, so no job is judged by a utilisation that is not its alone.
    """
    processes = list(processes)
    gpus = join_mig_uuids(gpus, processes)
    running = {j.job_id: j for j in jobs if j.running}
    #: nodes where a running job holds GPUs no source places (Job.unplaced_gpus); "": a job naming no node
    unplaced: set[str] = set()
    alloc: dict[tuple[str, int], set[str]] = defaultdict(set)
    mig_alloc: dict[tuple[str, str], set[str]] = defaultdict(set)
    shared_jobs = {jid for jid, j in running.items() if j.gpu_shared}
    mig_hosts: AbstractSet[str]
    for j in running.values():
        if j.unplaced_gpus:
            unplaced.update(j.nodes or ("",))
        if j.mig_alloc:
            mig_hosts = {h for h, _ in j.mig_alloc}
            for host, slices in j.mig_alloc:
                for sl in slices:
                    mig_alloc[(host, sl)].add(j.job_id)
        else:
            mig_hosts = _NONE
        for host, idx in j.gpu_alloc:
            if host in mig_hosts:
                continue  # on this node its GPU indices count slices, not physical GPUs
            for i in idx:
                alloc[(host, int(i))].add(j.job_id)
    by_uuid: dict[str, set[str]] = defaultdict(set)
    by_index: dict[tuple[str, int], set[str]] = defaultdict(set)
    by_slice: dict[tuple[str, int, str], set[str]] = defaultdict(set)
    orphans_uuid: dict[str, list[GpuProcess]] = defaultdict(list)
    orphans_index: dict[tuple[str, int], list[GpuProcess]] = defaultdict(list)
    orphans_slice: dict[tuple[str, int, str], list[GpuProcess]] = defaultdict(list)
    for p in processes:
        if p.job_id:
            if p.gpu_uuid:
                by_uuid[p.gpu_uuid].add(p.job_id)
            if p.gpu is not None and not p.mig and not p.gpu_uuid.startswith("MIG-"):
                by_index[(p.host, int(p.gpu))].add(p.job_id)
            if p.gpu is not None and p.mig:
                by_slice[(p.host, int(p.gpu), p.mig)].add(p.job_id)
        if p.container is None and (not p.job_id or p.job_id not in running):
            if p.gpu_uuid:
                orphans_uuid[p.gpu_uuid].append(p)
            if p.gpu is not None and not p.mig and not p.gpu_uuid.startswith("MIG-"):
                orphans_index[(p.host, int(p.gpu))].append(p)
            if p.gpu is not None and p.mig:
                orphans_slice[(p.host, int(p.gpu), p.mig)].append(p)
    hosts = gpus["host"].tolist()
    idxs = gpus["gpu"].astype(int).tolist()
    n = len(gpus)
    uuids = gpus["uuid"].fillna("").tolist() if "uuid" in gpus else [""] * n
    labels = gpus["label_job_id"].fillna("").astype(str).tolist() if "label_job_id" in gpus else [""] * n
    migs = gpus["mig"].fillna("").astype(str).tolist() if "mig" in gpus else [""] * n
    mig_uuids = gpus["mig_uuid"].fillna("").astype(str).tolist() if "mig_uuid" in gpus else [""] * n
    job_ids: list[str | None] = []
    how: list[str] = []
    sharers: dict[int, str] = {}  # row -> the jobs sharing it
    problems: list[Disagreement] = []
    holders: AbstractSet[str]
    cg: AbstractSet[str]
    slurm: str | None
    for row, (host, gpu, uuid, label, mig, mig_uuid) in enumerate(zip(hosts, idxs, uuids, labels, migs, mig_uuids,
                                                                       strict=True)):
        if mig:
            holders = mig_alloc.get((host, f"{gpu}/{mig}"), set()) | (mig_alloc.get((host, mig_uuid), set())
                                                                      if mig_uuid else set())
            cg = by_slice.get((host, gpu, mig), set()) | (by_uuid.get(mig_uuid, set()) if mig_uuid else set())
            both = orphans_slice.get((host, gpu, mig), []) + (orphans_uuid.get(mig_uuid, []) if mig_uuid else [])
            leftovers = list({p.key: p for p in both}.values())  # a process may name the slice both ways
        else:
            key = (host, gpu)
            holders = alloc.get(key, _NONE)
            on_uuid, on_index = by_uuid.get(uuid), by_index.get(key)
            cg = on_uuid | on_index if on_uuid and on_index else on_uuid or on_index or _NONE
            leftovers = orphans_uuid.get(uuid, []) if uuid else orphans_index.get(key, [])
        # Slurm's holders are running jobs: processes of the holder alone are running ones (the common case)
        cg_running = cg if not cg or cg == holders else {c for c in cg if c in running}
        if len(holders) > 1 or (shared_jobs and not holders.isdisjoint(shared_jobs)):
            # several jobs on one device: its utilisation is nobody's alone
            job_ids.append(None)
            how.append("shared")
            sharers[row] = ",".join(sorted(holders | cg_running))
            continue
        (slurm,) = holders or (None,)
        if mig and slurm is None and len(cg_running) == 1:
            (only,) = cg_running
            job = running[only]
            if any(h == host for h, _ in (*job.gpu_alloc, *job.mig_alloc)) and label in ("", only):
                # the job's own process runs on the slice (its MIG UUID in the environment or cgroup)
                job_ids.append(only)
                how.append("cgroup")
                continue
        label_running = label if label in running else None
        if (not cg_running or cg_running == holders) and (not label_running or label_running == slurm):
            claims = 1  # the common case: Slurm's word alone, or the exporter's label or the processes agreeing with it
        else:
            claims = len({c for c in (slurm, label_running, *cg_running) if c})
        if claims > 1:
            job_ids.append(None)
            how.append("conflict")
            problems.append(Disagreement(host, gpu, f"{_slice(mig)}sources name different jobs: slurm={slurm or '-'} "
                                                    f"label={label or '-'} cgroup={','.join(sorted(cg)) or '-'}"))
            continue
        if slurm:
            job_ids.append(slurm)
            how.append("slurm")
            if leftovers:
                problems.extend(_leftover(host, gpu, mig, p, slurm) for p in leftovers)
        elif label_running:
            # the exporter says a running job uses it but Slurm does not list the GPU for it
            job_ids.append(None)
            how.append("conflict")
            problems.append(Disagreement(host, gpu, f"{_slice(mig)}label names running job {label} but Slurm "
                                                    "allocates the GPU to none"))
        elif cg_running:
            job_ids.append(None)
            how.append("conflict")
            problems.append(Disagreement(host, gpu, f"{_slice(mig)}processes of running job(s) "
                                                    f"{','.join(sorted(cg_running))} on a GPU Slurm allocates to none"))
        elif host in unplaced or "" in unplaced:
            job_ids.append(None)
            how.append("unplaced")  # a running job holds GPUs on this node, which ones unknown: maybe this one
        else:
            job_ids.append(None)
            how.append("none")
    out = gpus.copy()
    out["job_id"] = pd.Series(job_ids, index=out.index, dtype=object)
    out["attribution"] = how
    if any(sharers.values()):
        shared_by = [""] * n
        for row, names in sharers.items():
            shared_by[row] = names
        out["sharers"] = pd.Series(shared_by, index=out.index, dtype=object)
    return out, problems


def _leftover(host: str, gpu: int, mig: str, p: GpuProcess, slurm: str) -> Disagreement:
    """Return the disagreement of an orphan process ``p`` on a device Slurm allocates to running job ``slurm``."""
    ended = f"of ended job {p.job_id}" if p.job_id else "of no job"
    return Disagreement(host, gpu, f"{_slice(mig)}process {p.pid} {ended} holds {p.used_mib:g} MiB "
                                   f"on a GPU Slurm allocates to running job {slurm}")


def _slice(mig: str) -> str:
    return f"MIG slice {mig}: " if mig else ""


def join_mig_uuids(gpus: pd.DataFrame, processes: Iterable[GpuProcess]) -> pd.DataFrame:
    """Return ``gpus`` with the MIG UUID of slices the metrics name only by GPU instance id.

    dcgm-exporter labels a slice with its parent's UUID and its ``GPU_I_ID``/``GPU_I_PROFILE``;
    nvidia-smi names the slice a process runs in by its MIG UUID. The node wrapper's ``inspect``
    reports each slice's GPU instance id (``nvidia-smi -q``), carried as the process's ``mig``:
    a process with a MIG UUID and a ``mig`` names that slice exactly. From an older wrapper that
    does not report it, only the profile (``-L``) is known: where one slice of a GPU has a profile
    and the processes on that GPU with that profile name one MIG UUID, that UUID is the slice's;
    slices sharing a profile then stay unjoined (no data, no action).
    """
    if "mig" not in gpus or "mig_uuid" not in gpus:
        return gpus
    exact: dict[tuple[str, int, str], set[str]] = defaultdict(set)
    seen: dict[tuple[str, int, str], set[str]] = defaultdict(set)
    for p in processes:
        if not p.gpu_uuid.startswith("MIG-") or p.gpu is None:
            continue
        if p.mig:
            exact[(p.host, int(p.gpu), p.mig)].add(p.gpu_uuid)
        elif p.mig_profile:
            seen[(p.host, int(p.gpu), p.mig_profile)].add(p.gpu_uuid)
    if not seen and not exact:
        return gpus
    hosts = gpus["host"].astype(str).tolist()
    idxs = gpus["gpu"].astype(int).tolist()
    keys = list(zip(hosts, idxs, gpus["mig_profile"].fillna("").astype(str), strict=True))
    counts: dict[tuple[str, int, str], int] = defaultdict(int)
    for k in keys:
        counts[k] += 1
    uuids = gpus["mig_uuid"].fillna("").astype(str).tolist()
    changed = False
    for pos, (k, mig) in enumerate(zip(keys, gpus["mig"].fillna("").astype(str), strict=True)):
        if not mig or uuids[pos]:
            continue
        found = exact.get((hosts[pos], idxs[pos], mig), set())
        if not found and counts[k] == 1:
            found = seen.get(k, set())
        if len(found) == 1:
            uuids[pos] = next(iter(found))
            changed = True
    if not changed:
        return gpus
    out = gpus.copy()
    out["mig_uuid"] = pd.Series(uuids, index=out.index, dtype=object)
    return out
