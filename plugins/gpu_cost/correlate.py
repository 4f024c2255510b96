"""Join GPUs, processes and jobs into one picture, and say so where the sources disagree.

A GPU is attributed to a job by, in order of trust: the scheduler's allocation (Slurm's GPU
indices on that node), the exporter's job label (dcgm-exporter ``hpc_job``), the cgroup of the
processes on it. When two of them name *different running* jobs the GPU is marked ``conflict``
and the rules leave it alone. Processes are matched to GPUs by UUID first, by index otherwise.
An orphan process (no job, or a job that ended) on a GPU that Slurm allocates to a running job
does not change the attribution but is reported as a disagreement: the job's owner shares the
GPU with a leftover they may not know about.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import pandas as pd

from gpu_cost.model import Disagreement, GpuProcess, Job


def attribute(gpus: pd.DataFrame, jobs: Iterable[Job], processes: Iterable[GpuProcess]) -> tuple[pd.DataFrame, list[Disagreement]]:
    """Return ``gpus`` with ``job_id`` and ``attribution`` columns, and the disagreements found."""
    running = {j.job_id: j for j in jobs if j.running}
    alloc: dict[tuple[str, int], str] = {}
    for j in running.values():
        for host, idx in j.gpu_alloc:
            for i in idx:
                alloc[(host, int(i))] = j.job_id
    by_uuid: dict[str, set[str]] = defaultdict(set)
    by_index: dict[tuple[str, int], set[str]] = defaultdict(set)
    orphans_uuid: dict[str, list[GpuProcess]] = defaultdict(list)
    orphans_index: dict[tuple[str, int], list[GpuProcess]] = defaultdict(list)
    for p in processes:
        if p.job_id:
            if p.gpu_uuid:
                by_uuid[p.gpu_uuid].add(p.job_id)
            if p.gpu is not None:
                by_index[(p.host, int(p.gpu))].add(p.job_id)
        if p.container is None and (not p.job_id or p.job_id not in running):
            if p.gpu_uuid:
                orphans_uuid[p.gpu_uuid].append(p)
            if p.gpu is not None:
                orphans_index[(p.host, int(p.gpu))].append(p)
    hosts = gpus["host"].tolist()
    idxs = gpus["gpu"].astype(int).tolist()
    uuids = gpus["uuid"].fillna("").tolist() if "uuid" in gpus else [""] * len(gpus)
    labels = gpus["label_job_id"].fillna("").astype(str).tolist() if "label_job_id" in gpus else [""] * len(gpus)
    job_ids: list[str | None] = []
    how: list[str] = []
    problems: list[Disagreement] = []
    for host, gpu, uuid, label in zip(hosts, idxs, uuids, labels, strict=True):
        slurm = alloc.get((host, gpu))
        cg = by_uuid.get(uuid, set()) | by_index.get((host, gpu), set())
        cg_running = {c for c in cg if c in running}
        label_running = label if label in running else None
        claims = {c for c in (slurm, label_running, *cg_running) if c}
        if len(claims) > 1:
            job_ids.append(None)
            how.append("conflict")
            problems.append(Disagreement(host, gpu, f"sources name different jobs: slurm={slurm or '-'} "
                                                    f"label={label or '-'} cgroup={','.join(sorted(cg)) or '-'}"))
            continue
        if slurm:
            job_ids.append(slurm)
            how.append("slurm")
            leftovers = orphans_uuid.get(uuid, []) if uuid else orphans_index.get((host, gpu), [])
            for p in leftovers:
                ended = f"of ended job {p.job_id}" if p.job_id else "of no job"
                problems.append(Disagreement(host, gpu, f"process {p.pid} {ended} holds {p.used_mib:g} MiB on a GPU "
                                                        f"Slurm allocates to running job {slurm}"))
        elif label_running:
            # the exporter says a running job uses it but Slurm does not list the GPU for it
            job_ids.append(None)
            how.append("conflict")
            problems.append(Disagreement(host, gpu, f"label names running job {label} but Slurm allocates the GPU to none"))
        elif cg_running:
            job_ids.append(None)
            how.append("conflict")
            problems.append(Disagreement(host, gpu, f"processes of running job(s) {','.join(sorted(cg_running))} "
                                                    "on a GPU Slurm allocates to none"))
        else:
            job_ids.append(None)
            how.append("none")
    out = gpus.copy()
    out["job_id"] = pd.Series(job_ids, index=out.index, dtype=object)
    out["attribution"] = how
    return out, problems
