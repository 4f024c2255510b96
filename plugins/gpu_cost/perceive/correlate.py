"""Join GPUs, processes and jobs into one picture, and say so where the sources disagree.

A GPU is attributed to a job by, in order of trust: the scheduler's allocation (Slurm's GPU
indices on that node), the exporter's job label (dcgm-exporter ``hpc_job``), the cgroup of the
processes on it. When two of them name *different running* jobs the GPU is marked ``conflict``
and the rules leave it alone. Processes are matched to GPUs by UUID first, by index otherwise.
An orphan process (no job, or a job that ended) on a GPU that Slurm allocates to a running job
does not change the attribution but is reported as a disagreement: the job's owner shares the
GPU with a leftover they may not know about. A GPU no source names, on a node where a running
job holds GPUs no source places (an accounting export has no GPU indices), is ``unplaced``, not
``none``: it may be that job's, so it is nobody's zombie. So is a GPU on a host the scheduler does
not name while a node it runs GPU jobs on has no GPU series (:func:`unseen_nodes`): the host may
be that node under a name no rule matches (an IP address), its GPUs that node's jobs'. And so is a
GPU on a node's second name (:func:`aliases`: ``gpu01.example.org`` beside ``gpu01``, an exporter
relabelled mid-trace): the node's jobs may be using it. So, in a trace, is a GPU the exporter
labels with a job the jobs file does not list: nothing says that job ended. And so is a GPU on a
host outside the scheduler (one its node list, or a trace's jobs file, never names): an inference
server or a workstation the same Prometheus scrapes runs processes no job owns, and they are not
the agent's to kill.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

import numpy as np
import pandas as pd

from gpu_cost.core.model import Disagreement, GpuProcess, Job, Node

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
    out: dict[str, str] = {}
    for h, names in _candidates(metric, scheduler_hosts).items():
        if len(names) == 1 and names[0] not in metric:
            out[h] = names[0]
    taken = Counter(out.values())
    return {h: name for h, name in out.items() if taken[name] == 1}


def aliases(metric_hosts: Iterable[str], scheduler_hosts: Iterable[str]) -> set[str]:
    """Return the metric hosts the scheduler does not know that are another name of one or more of its nodes
    (:func:`host_names`' match), renamed or not: after renaming, those left are a node's second name (the node's
    own name is also a series' host: an exporter relabelled mid-trace) or a name of two nodes. Their GPUs may be
    a running job's, seen twice."""
    return {h for h, names in _candidates(set(metric_hosts), scheduler_hosts).items() if names}


def _candidates(metric: AbstractSet[str], scheduler_hosts: Iterable[str]) -> dict[str, list[str]]:
    """Return, for each metric host the scheduler does not know, the scheduler's names that match it: in any
    letter case and without a port, its own name, else its first label, else the full names it is the first
    label of."""
    known = set(scheduler_hosts)
    if not known or metric <= known:
        return {}
    # host names are case-insensitive (RFC 4343): a node is GPU01 to one source and gpu01 to the other; a port
    # is no part of them (Prometheus's instance label is host:port, and a trace exported from it may name hosts so)
    full_names: dict[str, list[str]] = defaultdict(list)  # by first label
    exact: dict[str, list[str]] = defaultdict(list)
    for k in known:
        full_names[k.split(".", 1)[0].lower()].append(k)
        exact[k.lower()].append(k)
    out: dict[str, list[str]] = {}
    for h in metric - known:
        bare = _without_port(h).lower()
        short = bare.split(".", 1)[0]
        if bare in exact:
            out[h] = exact[bare]
        elif short != bare:
            out[h] = exact.get(short, [])
        else:
            out[h] = full_names.get(short, [])
    return out


def _without_port(host: str) -> str:
    """Return ``host`` without a ``:port`` (``gpu01:9400`` → ``gpu01``); an IPv6 address (two colons) as it is."""
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() and ":" not in name and name else host


def gpu_job_nodes(jobs: Iterable[Job]) -> set[str]:
    """Return the nodes the running ``jobs`` hold GPUs on (placed or not: a job's ``nodes`` when it holds GPUs)."""
    out: set[str] = set()
    for j in jobs:
        if not j.running:
            continue
        out.update(h for h, _ in j.gpu_alloc)
        out.update(h for h, _ in j.mig_alloc)
        if j.gpus_requested > 0:
            out.update(j.nodes)
    return out


def unseen_nodes(series_hosts: Iterable[str], jobs: Iterable[Job], nodes: Iterable[Node] = ()) -> list[str]:
    """Return the nodes (sorted) where the scheduler says GPUs are in use and no GPU series is: those of its
    node list with GPUs allocated (``nodes``), or, without a node list (a trace), those its running jobs hold
    GPUs on. A sweep that sees them is degraded (:func:`unseen_problem`): part of what runs is not seen."""
    node_list = list(nodes)
    busy = {n.name for n in node_list if n.gpus_alloc} if node_list else gpu_job_nodes(jobs)
    return sorted(busy - set(series_hosts))


def uncovered(series_hosts: Iterable[str], managed: AbstractSet[str] | None) -> bool:
    """True when the unseen nodes (:func:`unseen_nodes`) of a trace are nodes its samples do not cover, not nodes
    seen under another name: every series host is one the trace's jobs file names (``managed``). A trace covers
    the nodes it covers (a dataset of some racks, beside the whole cluster's jobs), for good: the unseen nodes' jobs
    have no GPU to judge, and nothing else is held back. A live sweep has no ``managed``: an exporter that stopped is
    a problem there, the whole run degraded until it is back."""
    return managed is not None and set(series_hosts) <= managed


def some(names: Sequence[str], n: int) -> str:
    """Return the first ``n`` of ``names`` as a note lists them, with an ellipsis when there are more."""
    return ", ".join(names[:n]) + ("…" if len(names) > n else "")


def uncovered_note(nodes: Sequence[str]) -> str:
    """Return what a trace's :func:`uncovered` nodes mean, in words (``nodes``: sorted)."""
    return (f"jobs ran on {len(nodes)} node(s) no sample shows ({some(nodes, 5)}), and every sampled host is one the jobs file "
            "names: the samples cover part of the cluster, so those jobs were judged by no rule and nothing else was "
            "held back (a sampled host the jobs do not name would have degraded every sweep: it might be one of those "
            "nodes under another name)")


def unseen_problem(unseen: list[str]) -> str:
    """Return the snapshot problem for :func:`unseen_nodes`' answer (not empty)."""
    return f"no GPU series for node(s) running GPU jobs: {', '.join(unseen[:10])} (exporter missing?)"


def sight_problems(gpus: pd.DataFrame, unseen: list[str], *, live: bool,
                   managed: AbstractSet[str] | None = None) -> list[str]:
    """Return the snapshot problems of what a sweep does not see, for :func:`attribute`'s frame and
    :func:`unseen_nodes`' answer: every GPU of the cluster stale or missing; on a live sweep (``live``), some of them
    (an exporter stopped, a scrape gap: part of the cluster unseen degrades the whole run until it is back; a trace's
    gap leaves those GPUs unjudged and the others judged); nodes running GPU jobs that no series shows, unless the
    trace's samples cover part of its cluster (:func:`uncovered`, with the jobs file's nodes ``managed``). A host
    outside the scheduler is no part of the cluster: its exporter stopping leaves the cluster seen whole."""
    out: list[str] = []
    stale = gpus["stale"].to_numpy(dtype=bool) if len(gpus) else np.zeros(0, dtype=bool)
    if stale.any():
        ours = gpus["attribution"].to_numpy(dtype=object) != "outside"
        mine = stale[ours]
        if len(mine) and mine.all():
            out.append("every GPU series is stale or missing")
        elif live and mine.any():
            hosts = sorted({str(h) for h in gpus["host"].to_numpy(dtype=object)[stale & ours]})
            out.append(f"stale or missing GPU series: {int(mine.sum())} of {len(mine)} GPUs "
                       f"(on {', '.join(hosts[:10])})")
    if unseen and not uncovered(gpus["host"].astype(str) if len(gpus) else (), managed):
        out.append(unseen_problem(unseen))
    return out


def scheduler_hosts(jobs: Iterable[Job], nodes: Iterable[str] = ()) -> set[str]:
    """Return the node names the scheduler uses: its nodes' and those its jobs run and hold GPUs on."""
    out = set(nodes)
    for j in jobs:
        out.update(j.nodes)
        out.update(h for h, _ in j.gpu_alloc)
        out.update(h for h, _ in j.mig_alloc)
    return out


def attribute(gpus: pd.DataFrame, jobs: Iterable[Job], processes: Iterable[GpuProcess],
              nodes: Iterable[Node] = (), recorded: AbstractSet[str] | None = None,
              unseen: Sequence[str] = (), managed: AbstractSet[str] | None = None,
              ) -> tuple[pd.DataFrame, list[Disagreement]]:
    """Return ``gpus`` with ``job_id`` and ``attribution`` columns, and the disagreements found.

    A MIG slice (a row with ``mig``) is a device of its own: Slurm's claim on it is the job's
    ``mig_alloc`` (``<gpu>/<gi>`` or the slice's MIG UUID), and the processes on it are those whose
    GPU UUID is the slice's MIG UUID or whose ``mig`` names its instance. A slice no job's
    ``mig_alloc`` names but where the processes of one running job holding GPUs on that node run
    is that job's (``cgroup``): Slurm's MIG gres indices do not say which slice they are.

    A device several running jobs hold (Slurm ``shard``/``mps`` gres, time-slicing: two jobs
    allocated the same GPU, or a job marked ``gpu_shared``) is ``shared``: its ``job_id`` is empty
    and ``sharers`` lists the jobs, so no job is judged by a utilisation that is not its alone.

    :param nodes: the scheduler's node list, when it has one (a live sweep): the names it knows.
    :param unseen: :func:`unseen_nodes` of these GPUs (the caller says it as a problem too): while one is, a
        host the scheduler does not name may be it.
    :param recorded: every job id the scheduler's record holds, running or ended (a trace's jobs file), when
        that record may miss jobs: a GPU the exporter labels with a job it does not hold is ``unplaced``, since
        nothing says that job ended. ``None`` (a live sweep): Slurm lists every running job, so a label naming
        none of them is an ended job's.
    :param managed: every node the scheduler's record names (a trace's jobs file, over its span), where there is no
        node list. A host neither it nor the node list names, and no running job holds, is outside the scheduler
        (an inference server, a workstation, a Kubernetes node scraped by the same Prometheus): its GPUs are
        ``outside``, judged by no rule, their processes nobody's zombies, not counted as the cluster's. ``None``
        with no node list: every host is taken as the scheduler's (a bare sample set).
    """
    processes = list(processes)
    node_list = list(nodes)
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
    #: series hosts that may be a node seen under another name: its second name (the node's own is a series' too),
    #: or any name the scheduler does not know while a node it runs GPU jobs on has no series
    strangers: AbstractSet[str] = _NONE
    #: series hosts outside the scheduler: no node list, jobs file or running job names them
    outside: AbstractSet[str] = _NONE
    listed = {n.name for n in node_list}
    rest = set(hosts) - listed  # a live node list names every series host: no job to read
    if rest:
        known = scheduler_hosts(running.values(), listed)
        strangers = rest - known if unseen else aliases(rest, known)
        if listed or managed is not None:  # the scheduler's own nodes are known: the others are not its
            outside = rest - known - (managed or _NONE) - strangers
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
        elif host in outside:
            job_ids.append(None)
            how.append("outside")  # not the scheduler's machine: its processes are no job's, nor the agent's to kill
        elif (host in unplaced or "" in unplaced or host in strangers
              or (label and recorded is not None and label not in recorded)):
            job_ids.append(None)
            how.append("unplaced")  # a running job holds GPUs here (or on a node seen by no name): maybe this one
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
