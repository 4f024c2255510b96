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
    given = False
    if m.users:
        if (f.user or "") not in m.users:
            return False
        given = True
    if m.accounts:
        if (f.account or "") not in m.accounts:
            return False
        given = True
    if m.partitions:
        if (f.partition or "") not in m.partitions:
            return False
        given = True
    if m.qos:
        if (f.qos or "") not in m.qos:
            return False
        given = True
    if m.name_patterns:
        if not any(fnmatch.fnmatchcase(f.name or "", p) for p in m.name_patterns):
            return False
        given = True
    if m.labels:
        if not any(label in f.labels for label in m.labels):
            return False
        given = True
    if m.nodes:
        hosts = set(f.nodes) | ({f.host} if f.host else set()) | {g.split(":")[0] for g in f.gpu_ids}
        if not any(fnmatch.fnmatchcase(h, p) for h in hosts for p in m.nodes):
            return False
        given = True
    return given


def protection_for(f: Finding, protections: Iterable[Protection]) -> Protection | None:
    """Return the most restrictive protection covering the finding, or None.

    The engine asks twice per finding (its ladder, then the guard every way in passes): the last
    answer is kept for the same finding and protections (both frozen: the same objects, the same answer).
    """
    last = _LAST[0]
    if last is not None and last[0] is f and last[1] is protections:
        return last[2]
    best: Protection | None = None
    for p in protections:
        if matches(p.match, f) and (best is None or LEVEL_ORDER[p.level] < LEVEL_ORDER[best.level]):
            best = p
    _LAST[0] = (f, protections, best)
    return best


#: the last :func:`protection_for` question and answer
_LAST: list[tuple[Finding, Iterable[Protection], Protection | None] | None] = [None]


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
