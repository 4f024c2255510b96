"""Zombie: GPU memory held with ~0 % utilisation by processes that belong to no running job.

Policy (``rules.zombie``)::

    zombie:
      util_max: 5          # % — the GPU must stay under this for the whole window
      mem_min_mib: 1024    # memory held, MiB, throughout the window
      window: 15m
      ladder: [{action: notify}, {action: kill_process, after: 15m}]

A GPU qualifies when it is fresh (enough recent samples), attributed to no running job, and idle
with memory held over the whole window. With process data (nvidia-smi over SSH) each orphan
process is one finding (target ``proc:<host>:<pid>:<start>``); without it the GPU is the target
and only notification is possible.
"""

from __future__ import annotations

from collections import defaultdict

from gpu_cost.model import Finding, GpuProcess, Snapshot
from gpu_cost.policy.schema import Policy, ZombieRule
from gpu_cost.rules import register
from gpu_cost.rules.common import r


@register("zombie")
def zombie(snapshot: Snapshot, cfg: ZombieRule, policy: Policy) -> list[Finding]:
    """Return one finding per orphan process (or per GPU when processes are unknown)."""
    g = snapshot.view(cfg.window)
    if g.empty:
        return []
    mask = (
        ~g["stale"].astype(bool)
        & (g["attribution"] == "none")
        & (g["util_max"] < cfg.util_max)
        & (g["mem_min_mib"] > cfg.mem_min_mib)
    )
    cand = g[mask]
    if cand.empty:
        return []
    running = {j.job_id for j in snapshot.running_jobs()}
    procs_by_gpu: dict[tuple[str, str | int], list[GpuProcess]] = defaultdict(list)
    for p in snapshot.processes:
        if p.gpu_uuid:
            procs_by_gpu[(p.host, p.gpu_uuid)].append(p)
        elif p.gpu is not None:
            procs_by_gpu[(p.host, int(p.gpu))].append(p)
    have_procs = snapshot.source_has_processes if hasattr(snapshot, "source_has_processes") else bool(snapshot.processes)
    by_proc: dict[str, dict] = {}
    findings: list[Finding] = []
    for row in cand.itertuples(index=False):
        procs = procs_by_gpu.get((row.host, row.uuid), []) or procs_by_gpu.get((row.host, int(row.gpu)), [])
        evidence = {
            "util_max": r(row.util_max), "util_mean": r(row.util_mean), "mem_min_mib": r(row.mem_min_mib, 0),
            "samples": int(row.n_samples), "window_s": cfg.window, "last_job": row.label_job_id or None,
        }
        orphans = [p for p in procs if not p.job_id or p.job_id not in running]
        if orphans:
            for p in orphans:
                entry = by_proc.setdefault(p.key, {"proc": p, "gpus": [], "evidence": evidence, "mem": 0.0})
                entry["gpus"].append(f"{row.host}:{int(row.gpu)}")
                entry["mem"] += p.used_mib
            continue
        if procs:
            # processes of a running job sit on a GPU no job holds: the snapshot flags it as a conflict
            continue
        if have_procs:
            # process data exists for this host but shows nothing: memory without a process is a
            # driver/MIG artefact or a race with process exit; leave it
            continue
        findings.append(
            Finding(
                rule="zombie", target_kind="gpu", target=f"gpu:{row.host}:{int(row.gpu)}", action="notify", gpus=1,
                host=row.host, gpu_ids=(f"{row.host}:{int(row.gpu)}",), job_id=row.label_job_id or None,
                evidence=evidence,
            )
        )
    for key, entry in by_proc.items():
        p = entry["proc"]
        ev = dict(entry["evidence"])
        ev.update({"pid": p.pid, "process_start_ts": p.start_ts, "gpu_uuid": p.gpu_uuid, "process_mem_mib": r(entry["mem"], 0),
                   "process_name": p.name, "former_job": p.job_id})
        findings.append(
            Finding(
                rule="zombie", target_kind="process", target=key, action="kill_process", gpus=len(entry["gpus"]),
                user=p.user or None, host=p.host, gpu_ids=tuple(entry["gpus"]), job_id=p.job_id, evidence=ev,
            )
        )
    return findings
