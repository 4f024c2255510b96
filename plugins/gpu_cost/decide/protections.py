"""Protections: who and what the agent treats gently.

A protection matches findings (:func:`matches`); the off-hours power path asks about a node
itself (:func:`node_protection`: only ``match.nodes`` can name a bare node) and about each job on it
(:func:`job_protection`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from gpu_cost.config.schema import Match, Protection
from gpu_cost.core.globs import any_glob
from gpu_cost.core.model import Finding, Job

#: most restrictive first
LEVEL_ORDER = {"never": 0, "notify_only": 1, "approval": 2}


def matches(m: Match, f: Finding) -> bool:
    """Return True when every criterion given in ``m`` matches the finding (each list is an OR).

    A match with no criterion matches nothing. The first criterion that fails decides.
    """
    return _passes(_tests(m), f)


def _passes(tests: tuple[Callable[[Finding], bool], ...], f: Finding) -> bool:
    """:func:`matches` with the match's tests built: none given matches nothing; the first that fails decides."""
    if not tests:
        return False
    for test in tests:
        if not test(f):
            return False
    return True


@functools.lru_cache(maxsize=1024)
def _tests(m: Match) -> tuple[Callable[[Finding], bool], ...]:
    """Return one test per criterion ``m`` gives, built once per match (a sweep asks every finding)."""
    tests: list[Callable[[Finding], bool]] = []
    for values, field in ((m.users, "user"), (m.accounts, "account"), (m.partitions, "partition"), (m.qos, "qos")):
        if values:
            tests.append(_one_of(field, frozenset(values)))
    if m.name_patterns:
        names = any_glob(m.name_patterns)
        tests.append(lambda f: names.match(f.name or "") is not None)
    if m.labels:
        labels = frozenset(m.labels)
        tests.append(lambda f: not labels.isdisjoint(f.labels))
    if m.nodes:
        nodes = any_glob(m.nodes)
        tests.append(lambda f: any(nodes.match(h) is not None for h in _hosts(f)))
    return tuple(tests)


def _one_of(field: str, allowed: frozenset[str]) -> Callable[[Finding], bool]:
    """Return a test: the finding's ``field`` (empty when unset) is one of ``allowed``."""
    return lambda f: (getattr(f, field) or "") in allowed


def _hosts(f: Finding) -> set[str]:
    """Return every node a finding names: its nodes, its host, the hosts of its GPU ids."""
    return set(f.nodes) | ({f.host} if f.host else set()) | {g.split(":")[0] for g in f.gpu_ids}


def protection_for(f: Finding, protections: Iterable[Protection]) -> Protection | None:
    """Return the most restrictive protection covering the finding, or None."""
    return most_restrictive(f, checks_of(protections))


#: each protection with its match's tests (:func:`checks_of`)
Checks = tuple[tuple[Protection, tuple[Callable[[Finding], bool], ...]], ...]


def checks_of(protections: Iterable[Protection]) -> Checks:
    """Return each protection with its match's tests, to ask many findings (a sweep asks every one)."""
    return tuple((p, _tests(p.match)) for p in protections)


def most_restrictive(f: Finding, checks: Checks) -> Protection | None:
    """:func:`protection_for` with the protections' tests already built (:func:`checks_of`)."""
    best: Protection | None = None
    for p, tests in checks:
        if _passes(tests, f) and (best is None or LEVEL_ORDER[p.level] < LEVEL_ORDER[best.level]):
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
