"""Protections: who and what the agent treats gently.

A protection matches findings (:func:`matches`); the off-hours power path asks about a node
itself (:func:`node_protection`: only ``match.nodes`` can name a bare node) and about each job on it
(:func:`job_protection`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from gpu_cost.model import Finding, Job
from gpu_cost.policy.schema import Match, Protection

#: most restrictive first
LEVEL_ORDER = {"never": 0, "notify_only": 1, "approval": 2}


def matches(m: Match, f: Finding) -> bool:
    """Return True when every criterion given in ``m`` matches the finding (each list is an OR).

    A match with no criterion matches nothing. The first criterion that fails decides.
    """
    criteria = (
        (m.users, lambda: (f.user or "") in m.users),
        (m.accounts, lambda: (f.account or "") in m.accounts),
        (m.partitions, lambda: (f.partition or "") in m.partitions),
        (m.qos, lambda: (f.qos or "") in m.qos),
        (m.name_patterns, lambda: any(fnmatch.fnmatchcase(f.name or "", p) for p in m.name_patterns)),
        (m.labels, lambda: any(label in f.labels for label in m.labels)),
        (m.nodes, lambda: any(fnmatch.fnmatchcase(h, p) for h in _hosts(f) for p in m.nodes)),
    )
    given = [test for values, test in criteria if values]
    return bool(given) and all(test() for test in given)


def _hosts(f: Finding) -> set[str]:
    """Return every node a finding names: its nodes, its host, the hosts of its GPU ids."""
    return set(f.nodes) | ({f.host} if f.host else set()) | {g.split(":")[0] for g in f.gpu_ids}


def protection_for(f: Finding, protections: Iterable[Protection]) -> Protection | None:
    """Return the most restrictive protection covering the finding, or None."""
    best: Protection | None = None
    for p in protections:
        if matches(p.match, f) and (best is None or LEVEL_ORDER[p.level] < LEVEL_ORDER[best.level]):
            best = p
    return best


def node_protection(name: str, protections: Iterable[Protection]) -> Protection | None:
    """Return the most restrictive protection naming node ``name`` itself, or None.

    A bare node has no user, account, partition, QOS, job name or label, so only protections whose
    match is ``nodes`` alone cover it; ``{nodes: [gpu-a*], users: [alice]}`` covers alice's jobs
    there (see :func:`job_protection`), not the idle node.
    """
    f = Finding(rule="offhours", target_kind="node", target=f"node:{name}", action="power_down", gpus=0,
                host=name, nodes=(name,))
    return protection_for(f, protections)


def job_protection(job: Job, protections: Iterable[Protection]) -> Protection | None:
    """Return the most restrictive protection covering ``job`` (on every node it runs on or holds), or None."""
    hosts = tuple(dict.fromkeys((*job.nodes, *(h for h, _ in job.gpu_alloc))))
    f = Finding(rule="offhours", target_kind="job", target=f"job:{job.job_id}", action="none", gpus=job.gpu_count,
                job_id=job.job_id, user=job.user, account=job.account, partition=job.partition, qos=job.qos,
                name=job.name, labels=job.labels, nodes=hosts, host=hosts[0] if len(hosts) == 1 else None)
    return protection_for(f, protections)
