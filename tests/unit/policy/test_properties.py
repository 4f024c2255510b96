"""Properties of the engine (hypothesis): protections hold, caps hold, decisions are idempotent."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_cost.core.model import DESTRUCTIVE_ACTIONS, Finding
from gpu_cost.decide.engine import NOTICE_ACTIONS, check_caps, decide
from tests.fixtures.core import NOW
from tests.unit.policy.helpers import H, job_finding, policy_from, process_finding

USERS = ["alice", "bob", "carol", "dave"]
LEVELS = {"alice": "never", "bob": "notify_only", "carol": "approval"}
POLICY = policy_from(
    "mode: enforce\n"
    "caps: {max_actions_per_run: 5, max_gpu_share: 0.25}\n"
    "protections:\n"
    + "".join(f"  - {{name: {u}, level: {lvl}, match: {{users: [{u}]}}}}\n" for u, lvl in LEVELS.items())
)

finding = st.builds(
    lambda i, user, gpus, ran, inference, kind: (
        process_finding(1000 + i, user=user, gpus=gpus, now=NOW) if kind == "proc"
        else job_finding(str(i), user=user, gpus=gpus, ran_s=ran, now=NOW, inference=inference)
    ),
    st.integers(0, 10_000), st.sampled_from(USERS), st.integers(1, 8), st.floats(0, 100 * H),
    st.booleans(), st.sampled_from(["job", "job", "proc"]),
)
# escalation state per target: last rung carried out (-1: none yet) and how long ago
state = st.tuples(st.integers(-1, 5), st.floats(0, 10 * H))


def _escalations(findings: list[Finding], states: list[tuple[int, float]]) -> dict:
    out = {}
    for f, (rung, ago) in zip(findings, states, strict=False):
        out[(f.rule, f.target, "live")] = {"state": "open", "episode": 1, "rung": rung, "first_seen": NOW - ago - 1,
                                           "last_action_at": (NOW - ago) if rung >= 0 else None}
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(finding, max_size=12, unique_by=lambda f: f.target), st.lists(state, max_size=12))
def test_protected_targets_are_never_acted_on_beyond_their_level(findings, states) -> None:  # type: ignore[no-untyped-def]
    plan = decide(findings, POLICY, now=NOW, escalations=_escalations(findings, states), total_gpus=64)
    for d in plan.decisions:
        level = LEVELS.get(d.user or "")
        f = next(x for x in findings if x.target == d.target)
        if level == "never":
            assert d.action == "none" and not d.acts
        elif level == "notify_only":
            assert d.action in NOTICE_ACTIONS
        elif level == "approval" and d.action in DESTRUCTIVE_ACTIONS:
            assert d.requires_approval
        if f.inference:
            assert d.action in ("advise", "none")
        if d.destructive and d.acts:
            assert level in (None, "approval")


@settings(max_examples=150, deadline=None)
@given(st.lists(finding, max_size=30, unique_by=lambda f: f.target), st.lists(state, max_size=30),
       st.integers(1, 200))
def test_caps_are_never_exceeded(findings, states, total_gpus) -> None:  # type: ignore[no-untyped-def]
    plan = decide(findings, POLICY, now=NOW, escalations=_escalations(findings, states), total_gpus=total_gpus)
    acting = [d for d in plan.decisions if d.acts and d.action not in ("none", "advise")]
    destructive_gpus = sum(d.gpus for d in acting if d.destructive)
    within = len(acting) <= POLICY.caps.max_actions_per_run and destructive_gpus <= 0.25 * total_gpus
    assert (plan.cap_violation is None) == within
    assert check_caps(plan.decisions, POLICY, total_gpus) == plan.cap_violation


@settings(max_examples=100, deadline=None)
@given(st.lists(finding, max_size=12, unique_by=lambda f: f.target), st.lists(state, max_size=12))
def test_the_same_state_gives_the_same_decisions(findings, states) -> None:  # type: ignore[no-untyped-def]
    esc = _escalations(findings, states)
    a = decide(findings, POLICY, now=NOW, escalations=esc, total_gpus=64)
    b = decide(list(reversed(findings)), POLICY, now=NOW, escalations=dict(esc), total_gpus=64)
    assert sorted(d.decision_id for d in a.decisions) == sorted(d.decision_id for d in b.decisions)
    assert len({d.decision_id for d in a.decisions}) == len(a.decisions)


glob = st.text(alphabet="ab*?[]!-.", max_size=6)
name = st.text(alphabet="ab-.[]", max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(glob, min_size=1, max_size=3), st.lists(name, min_size=1, max_size=3))
def test_protection_globs_match_as_fnmatchcase_does(patterns, names) -> None:  # type: ignore[no-untyped-def]
    """A protection's name and node globs are one compiled regex: it agrees with ``fnmatchcase`` on each glob."""
    import fnmatch

    from gpu_cost.config.schema import Match
    from gpu_cost.decide.protections import matches

    by_name, by_node = Match(name_patterns=tuple(patterns)), Match(nodes=tuple(patterns))
    for n in names:
        f = Finding(rule="idle_allocation", target_kind="job", target="job:1", action="notify", gpus=1, name=n,
                    nodes=(n,))
        expected = any(fnmatch.fnmatchcase(n, p) for p in patterns)
        assert matches(by_name, f) is expected, (patterns, n)
        assert matches(by_node, f) is expected, (patterns, n)
