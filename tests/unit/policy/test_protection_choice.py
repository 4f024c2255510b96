"""Which protection covers a finding: the most restrictive of those whose every criterion matches it, read plainly.

The engine builds each protection's tests once per sweep (``checks_of``) and asks every finding; a single question
(``protection_for``) builds them on the spot. Both must give what a plain reading of the rule gives.
"""

from __future__ import annotations

import fnmatch
import random

import pytest

from gpu_cost.config.schema import Match, Protection
from gpu_cost.core.model import Finding
from gpu_cost.decide.protections import LEVEL_ORDER, checks_of, most_restrictive, protection_for

_FIELDS = {"users": "user", "accounts": "account", "partitions": "partition", "qos": "qos"}
_WORDS = ["ann", "bob", "ml", "gpu", "prod", "serve-1", "g01", "g02", ""]


def _covers(m: Match, f: Finding) -> bool:
    """Every criterion the match gives holds (a list: any of it); a match that gives none covers nothing."""
    hosts = set(f.nodes) | ({f.host} if f.host else set()) | {g.split(":")[0] for g in f.gpu_ids}
    tests = [(getattr(f, attr) or "") in getattr(m, key) for key, attr in _FIELDS.items() if getattr(m, key)]
    if m.name_patterns:
        tests.append(any(fnmatch.fnmatchcase(f.name or "", p) for p in m.name_patterns))
    if m.labels:
        tests.append(any(label in f.labels for label in m.labels))
    if m.nodes:
        tests.append(any(fnmatch.fnmatchcase(h, p) for h in hosts for p in m.nodes))
    return bool(tests) and all(tests)


def _plain(f: Finding, protections: list[Protection]) -> Protection | None:
    covering = [p for p in protections if _covers(p.match, f)]
    return min(covering, key=lambda p: LEVEL_ORDER[p.level]) if covering else None  # the first of the mildest ties


def _match(rng: random.Random) -> Match:
    pick = lambda: tuple(rng.sample(_WORDS, rng.randint(1, 2))) if rng.random() < 0.35 else ()  # noqa: E731
    globs = lambda: tuple(rng.choice(["serve-*", "g0[1-2]", "*", "ml", "g?1"]) for _ in range(rng.randint(1, 2))) \
        if rng.random() < 0.3 else ()  # noqa: E731
    return Match(users=pick(), accounts=pick(), partitions=pick(), qos=pick(), name_patterns=globs(),
                 labels=pick(), nodes=globs())


@pytest.mark.parametrize("seed", range(10))
def test_the_covering_protection_is_the_plain_reading(seed: int) -> None:
    rng = random.Random(seed)
    for _case in range(60):
        protections = [Protection(name=f"p{k}", level=rng.choice(list(LEVEL_ORDER)), match=_match(rng))
                       for k in range(rng.randint(0, 5))]
        checks = checks_of(protections)
        for _f in range(10):
            f = Finding(rule="idle_allocation", target_kind="job", target="job:1", action="notify", gpus=1,
                        user=rng.choice(_WORDS), account=rng.choice(_WORDS), partition=rng.choice(_WORDS),
                        qos=rng.choice(_WORDS), name=rng.choice(_WORDS),
                        labels=tuple(rng.sample(_WORDS, rng.randint(0, 2))), host=rng.choice(["g01", "g02", ""]),
                        gpu_ids=tuple(f"{h}:0" for h in rng.sample(["g01", "g02", "g11"], rng.randint(0, 2))))
            want = _plain(f, protections)
            assert protection_for(f, protections) is want, (seed, _case)
            assert most_restrictive(f, checks) is want, (seed, _case)


def test_a_protection_that_names_nothing_covers_nothing() -> None:
    f = Finding(rule="idle_allocation", target_kind="job", target="job:1", action="notify", gpus=1, user="ann")
    assert protection_for(f, [Protection(name="empty", level="never", match=Match())]) is None
