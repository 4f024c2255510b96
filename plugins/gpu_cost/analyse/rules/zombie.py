"""Zombie: GPU memory held with ~0 % utilisation by processes that belong to no running job.

Policy (``rules.zombie``)::

    zombie:
      util_max: 5          # % — the GPU must stay under this for the whole window
      mem_min_mib: 1024    # memory held, MiB, throughout the window
      window: 15m
      ladder: [{action: notify}, {action: kill_process, after: 15m}]
      act_on_owners: []    # also act on: system, or user names (never root nor a container)
      system_users: [nobody]

A MIG slice is a device of its own: it qualifies alone, and only the processes in it (its MIG
UUID, or its GPU instance) are its orphans, so a zombie on one slice never involves the job on
the next; a slice's finding carries its ``mig``, ``mig_profile`` and ``gpu_share``.

A GPU qualifies when it is fresh (enough recent samples), attributed to no running job, and idle
with memory held over the whole window. With process data (nvidia-smi over SSH) each orphan
process is one finding (target ``proc:<host>:<pid>:<start>``); without it the GPU is the target
and only notification is possible.

Processes outside Slurm are not ours by default: one of root, of a system account (a name in
``system_users``) or in a container is reported, never killed (the finding's action is
``advise``, its evidence says ``foreign_owner``: ``root``, ``system`` or ``container:<runtime>``),
unless ``act_on_owners`` names ``system`` or the owner; root and containers never (the node
wrapper refuses them, and a system uid it sees, whatever the agent asks). The verdict comes
from :mod:`gpu_cost.analyse.owners`, the same for the manual reclaim.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Annotated, NamedTuple

import numpy as np

from gpu_cost.analyse.evidence import signal
from gpu_cost.analyse.owners import not_ours, owner_evidence
from gpu_cost.analyse.rules import register
from gpu_cost.analyse.rules.common import r
from gpu_cost.config.schema import USER_NAME, Mode, Percent, Policy, Rung
from gpu_cost.config.typed import Dur, Invalid, Range
from gpu_cost.core.model import Finding, GpuProcess, Snapshot, device_id
from gpu_cost.core.registry import RuleSpec


@dataclass(frozen=True)
class ZombieRule:
    """GPU memory held with ~0 % utilisation by processes of no running job."""

    enabled: bool = True
    mode: Mode | None = None
    util_max: Percent = 5.0
    mem_min_mib: Annotated[float, Range(0, 10_000_000)] = 1024.0
    window: Annotated[float, Dur(), Range(60, 86400)] = 900.0
    ladder: tuple[Rung, ...] = (Rung("notify", 0.0), Rung("kill_process", 900.0))
    #: processes outside Slurm that are not ours: those of a system account named in
    #: ``system_users`` are only reported unless listed here, by the word ``system`` or by the
    #: owner's user name. Processes of root, of a system uid (under the node's ``UID_MIN``, or a
    #: ``nologin``/``false`` shell) and in a container are never killed: the node wrapper refuses them.
    act_on_owners: tuple[str, ...] = ()
    #: account names that count as system accounts whatever their uid
    system_users: tuple[str, ...] = ("nobody",)


#: how sure a zombie finding is: its process is in no running job and computes nothing
ZOMBIE_CONFIDENCE = 0.9


def why(f: Finding) -> str:
    """The decision reason for a zombie finding."""
    ev = f.evidence
    text = (f"{f.gpus} GPU(s) hold {ev.get('mem_min_mib')} MiB at ≤{ev.get('util_max')}% for "
            f"{int(ev.get('window_s', 0)) // 60} min with no running job")
    withheld = not_ours(ev) if f.action == "advise" else None
    if withheld:
        text += f" — {withheld}"
    return text


def check(cfg: ZombieRule, policy: Policy) -> None:
    """Refuse owners the node wrapper never acts on, and names that are no user names."""
    for key, names in (("act_on_owners", cfg.act_on_owners), ("system_users", cfg.system_users)):
        for i, owner in enumerate(names):
            if key == "act_on_owners" and owner == "root":
                raise Invalid(f"{key}[{i}]", "root's processes are never killed (the node wrapper refuses uid 0): "
                                             "they are only reported")
            if key == "act_on_owners" and owner == "container":
                raise Invalid(f"{key}[{i}]", "processes in a container are never killed (the node wrapper refuses "
                                             "them): they are only reported; stop them through their runtime")
            if not USER_NAME.match(owner):
                raise Invalid(f"{key}[{i}]", f"{owner!r} is not a user name"
                              + (" (or the word system)" if key == "act_on_owners" else ""))


SPEC = RuleSpec(
    "zombie", config=ZombieRule, rank=10, check=check, target="process", title="GPU memory held by a process of no running job",
    label="Zombie processes", why=why, window=lambda cfg, policy: cfg.window,
    doc="GPU memory held at ~0 % utilisation for the whole window by a process of no running job; one "
        "finding per orphan process (per GPU without process data: then only notices).",
    example="""
        rules:
          zombie:
            util_max: 5
            mem_min_mib: 1024
            window: 15m
            ladder: [{action: notify}, {action: kill_process, after: 15m}]
    """,
)


class _Row(NamedTuple):
    """A candidate GPU's columns the rule reads (the MIG ones only where the frame has them)."""

    host: str
    gpu: int
    uuid: str
    util_max: float
    util_mean: float
    mem_min_mib: float
    n_samples: int
    label_job_id: str
    mig: str = ""
    mig_uuid: str = ""
    mig_profile: str = ""
    share: float = 1.0


@register(SPEC)
def zombie(snapshot: Snapshot, cfg: ZombieRule, policy: Policy) -> list[Finding]:
    """Return one finding per orphan process (or per GPU when processes are unknown)."""
    g = snapshot.columns(cfg.window)
    if g.empty:
        return []
    with np.errstate(invalid="ignore"):  # over the columns' arrays (NaN compares False): most sweeps find none
        mask = (
            ~g.get("stale", bool)
            & (g.get("attribution", object) == "none")
            & (g.get("util_max", float) < cfg.util_max)
            & (g.get("mem_min_mib", float) > cfg.mem_min_mib)
        )
    if not mask.any():
        return []
    pos = np.flatnonzero(mask)
    running = {j.job_id for j in snapshot.running_jobs()}
    procs_by_gpu: dict[tuple[str, str | int], list[GpuProcess]] = defaultdict(list)
    for p in snapshot.processes:
        if p.gpu_uuid:
            procs_by_gpu[(p.host, p.gpu_uuid)].append(p)
        elif p.gpu is not None and not p.mig:
            procs_by_gpu[(p.host, int(p.gpu))].append(p)
        if p.mig and p.gpu is not None and not p.gpu_uuid.startswith("MIG-"):
            procs_by_gpu[(p.host, f"{int(p.gpu)}/{p.mig}")].append(p)
    has_mig = "mig" in g
    have_procs = snapshot.source_has_processes if hasattr(snapshot, "source_has_processes") else bool(snapshot.processes)
    by_proc: dict[str, dict] = {}
    findings: list[Finding] = []
    fields = [f for f in _Row._fields if has_mig or f not in _Row._field_defaults]  # a whole GPU's: no MIG columns
    columns = [g.get(col)[pos].tolist() for col in fields]  # the candidates' rows alone, as Python values
    for row in (_Row(*values) for values in zip(*columns, strict=True)):
        mig = str(row.mig or "") if has_mig else ""
        if mig:
            # a MIG slice is a device of its own: only the processes in that slice count
            procs = (procs_by_gpu.get((row.host, str(row.mig_uuid)), []) if row.mig_uuid else []) or \
                procs_by_gpu.get((row.host, f"{int(row.gpu)}/{mig}"), [])
        else:
            procs = procs_by_gpu.get((row.host, row.uuid), []) or procs_by_gpu.get((row.host, int(row.gpu)), [])
        device = device_id(row.host, int(row.gpu), mig)
        evidence = {
            "util_max": r(row.util_max), "util_mean": r(row.util_mean), "mem_min_mib": r(row.mem_min_mib, 0),
            "samples": int(row.n_samples), "window_s": cfg.window, "last_job": row.label_job_id or None,
        }
        if mig:
            evidence.update({"mig": mig, "mig_profile": row.mig_profile, "gpu_share": round(float(row.share), 4)})
        orphans = [p for p in procs if not p.job_id or p.job_id not in running]
        if orphans:
            for p in orphans:
                entry = by_proc.setdefault(p.key, {"proc": p, "gpus": [], "evidence": evidence, "mem": 0.0, "share": 0.0})
                entry["gpus"].append(device)
                entry["share"] += float(row.share) if mig else 1.0
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
                rule="zombie", target_kind="gpu", target=f"gpu:{device}", action="notify", gpus=1,
                host=row.host, gpu_ids=(device,), job_id=row.label_job_id or None,
                evidence=evidence, gpu_share=round(float(row.share), 4) if mig else None,
            )
        )
    for key, entry in by_proc.items():
        p = entry["proc"]
        ev = dict(entry["evidence"])
        ev.update({"pid": p.pid, "process_start_ts": p.start_ts, "gpu_uuid": p.gpu_uuid, "process_mem_mib": r(entry["mem"], 0),
                   "process_name": p.name, "former_job": p.job_id})
        ev.update(owner_evidence(p, cfg))
        action = "advise" if not_ours(ev) else "kill_process"  # not ours: reported, never killed
        ev["signals"] = [
            signal("GPU utilisation", f"max {ev['util_max']} % over {int(cfg.window) // 60} min",
                   f"under {cfg.util_max:g} %: the process computes nothing"),
            signal("Process", f"PID {p.pid}{f' ({p.name})' if p.name else ''} of {p.user or 'an unknown user'} "
                   f"holding {r(entry['mem'], 0)} MiB", "memory held on a GPU no running job has: "
                   + (f"its job {p.job_id} has ended" if p.job_id else "it belongs to no job")),
        ]
        ev["confidence"] = ZOMBIE_CONFIDENCE
        ev["confidence_why"] = [f"a process of no running job on an idle GPU: {ZOMBIE_CONFIDENCE:g}; the node "
                                "re-checks owner, start time and job before any signal"]
        findings.append(
            Finding(
                rule="zombie", target_kind="process", target=key, action=action, gpus=len(entry["gpus"]),
                user=p.user or None, host=p.host, gpu_ids=tuple(entry["gpus"]), job_id=p.job_id, evidence=ev,
                gpu_share=round(entry["share"], 4) if ev.get("mig") else None,
            )
        )
    return findings
