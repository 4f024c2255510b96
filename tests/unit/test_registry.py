"""The action and rule registry: one declaration each, every list derived from it.

``docs/reference/actions-and-rules.md`` is generated; after changing a spec, regenerate it with
``.venv/bin/python -m gpu_cost.core.registry > docs/reference/actions-and-rules.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpu_cost.act import dispatch
from gpu_cost.act.base import REGISTRY as EXECUTORS
from gpu_cost.act.base import register
from gpu_cost.analyse.rules import register as register_rule
from gpu_cost.analyse.rules.idle_allocation import IdleAllocationRule
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import LADDER_ACTIONS, Rules
from gpu_cost.core import paths, registry
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.model import ACTIONS, DESTRUCTIVE_ACTIONS, KILL_ACTIONS, Decision, Finding
from gpu_cost.core.registry import ActionSpec, RuleSpec
from gpu_cost.decide.engine import NOTICE_ACTIONS, decide, touches_work
from gpu_cost.loop.reclaim import ACTIONS_BY_KIND, FORM_ACTIONS, TARGET_KINDS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "actions-and-rules.md"

# What the code held as hand-written literals before the registry (a regression shows here).
OLD_ACTIONS = ("none", "advise", "notify", "notify_manager", "demote", "hold", "requeue", "terminate", "kill", "cancel",
               "kill_process", "power_down", "power_up", "reserve", "release_reservation", "alert_ops")
OLD_DESTRUCTIVE = {"demote", "hold", "requeue", "terminate", "kill", "cancel", "kill_process", "power_down",
                   "reserve", "release_reservation"}
OLD_KILL = {"terminate", "kill", "cancel", "kill_process"}
OLD_NOTICE = {"advise", "notify", "notify_manager", "alert_ops"}
OLD_LADDER = ("advise", "notify", "notify_manager", "demote", "hold", "requeue", "terminate", "kill", "cancel",
              "kill_process", "release_reservation")
OLD_FORM = ("notify", "demote", "cancel", "kill_process", "power_down")
OLD_BY_KIND = {
    "job": ("notify", "demote", "cancel"),
    "user": ("notify", "demote", "cancel"),
    "process": ("notify", "kill_process"),
    "node": ("notify", "power_down"),
}
OLD_FREEING = {"cancel", "terminate", "kill", "kill_process"}
OLD_RULE_ACTIONS = {
    "zombie": {"advise", "notify", "notify_manager", "kill_process"},
    "idle_allocation": {"advise", "notify", "notify_manager", "demote", "hold", "requeue", "terminate", "kill", "cancel"},
    "low_efficiency": {"advise", "notify", "notify_manager"},
    "idle_interactive": {"advise", "notify", "notify_manager", "demote", "hold", "requeue", "terminate", "kill", "cancel"},
    "anomaly": {"advise", "notify", "notify_manager"},
    # advice only: the idle ranks of a job may wait on its busy ones by design
    "partly_idle": {"advise", "notify", "notify_manager"},
    "idle_reservation": {"advise", "notify", "notify_manager", "release_reservation"},
}
OLD_CATEGORIES = {
    "notifications": ("Notifications", {"notify", "notify_manager", "advise", "alert_ops"}),
    "demotions": ("Demotions", {"demote"}),
    "cancels": ("Jobs cancelled", {"cancel", "terminate", "kill"}),
    "holds": ("Holds / requeues", {"hold", "requeue"}),
    "process_kills": ("Processes killed", {"kill_process"}),
    "power_downs": ("Nodes powered down", {"power_down"}),
    "power_ups": ("Nodes powered up", {"power_up"}),
    "reservations": ("Reservations made", {"reserve"}),
    "reservations_released": ("Reservations released or shrunk", {"release_reservation"}),
}


def _shipped_ladder_actions() -> set[str]:
    data = yaml.safe_load(paths.default_policy().read_text(encoding="utf-8"))
    used = {r["action"] for rule in (data.get("rules") or {}).values() for r in (rule or {}).get("ladder") or ()}
    defaults = Rules()
    used |= {r.action for name in defaults for r in defaults[name].ladder}
    return used


def test_every_used_action_has_one_spec_and_one_executor() -> None:
    dispatch.load_executors()
    specs = registry.actions()
    used = _shipped_ladder_actions() | set(FORM_ACTIONS) | set(LADDER_ACTIONS) | {"power_up"}
    for name in sorted(used):
        assert name in specs, f"{name}: no ActionSpec"
        assert name in EXECUTORS, f"{name}: no executor"
    assert set(specs) == set(EXECUTORS), "an executor without a spec, or a spec without an executor"
    # one declaration each: a second, different spec under a taken name is refused
    with pytest.raises(ValueError, match="declared twice"):
        registry.add_action(dataclasses.replace(specs["cancel"], title="something else"))


def test_every_rule_has_one_spec_a_detector_and_a_policy_section() -> None:
    specs = registry.rules()
    assert list(specs) == ["zombie", "idle_allocation", "low_efficiency", "idle_interactive", "partly_idle", "anomaly",
                           "idle_reservation"]
    defaults = Rules()
    assert list(defaults) == list(specs), "schema.Rules and the registered rules disagree"
    for name, spec in specs.items():
        assert spec.detect is not None
        assert type(getattr(defaults, name)) is type(defaults[name]) is spec.config
        assert spec.config.__module__ == spec.detect.__module__, f"{name}: its settings live apart from its detector"
        assert spec.title and spec.label and spec.doc.strip() and spec.example.strip()


def test_derived_sets_equal_the_old_literals() -> None:
    assert tuple(ACTIONS) == OLD_ACTIONS
    assert set(DESTRUCTIVE_ACTIONS) == OLD_DESTRUCTIVE
    assert set(KILL_ACTIONS) == OLD_KILL
    assert set(NOTICE_ACTIONS) == OLD_NOTICE
    from gpu_cost.act.notices.render import NOTICE_ACTIONS as NOTIFY_NOTICES
    from gpu_cost.act.savings import FREEING_ACTIONS
    from gpu_cost.report.kpis import CATEGORIES, FREEING

    assert set(NOTIFY_NOTICES) == OLD_NOTICE
    assert tuple(LADDER_ACTIONS) == OLD_LADDER
    assert tuple(FORM_ACTIONS) == OLD_FORM
    assert {k: ACTIONS_BY_KIND[k] for k in TARGET_KINDS} == OLD_BY_KIND
    assert set(FREEING_ACTIONS) == set(FREEING) == OLD_FREEING
    assert {n: set(registry.rule_actions(n)) for n in registry.rules()} == OLD_RULE_ACTIONS
    assert {k: (label, set(acts)) for k, label, acts in CATEGORIES} == OLD_CATEGORIES
    assert {a for a in registry.actions() if touches_work(a)} == OLD_DESTRUCTIVE - {
        "power_down", "reserve", "release_reservation"}
    assert {a for a, s in registry.actions().items() if s.final} == {"kill", "cancel", "kill_process"}
    # the live views behave like the frozensets they replace
    assert DESTRUCTIVE_ACTIONS == frozenset(OLD_DESTRUCTIVE)
    assert DESTRUCTIVE_ACTIONS | {"x"} == frozenset(OLD_DESTRUCTIVE | {"x"})
    assert "none" not in DESTRUCTIVE_ACTIONS and "cancel" in KILL_ACTIONS


def test_verbs_and_titles_come_from_the_spec() -> None:
    from gpu_cost.act.notices.render import action_title, rule_title

    cancel = registry.actions()["cancel"]
    assert (cancel.verb, cancel.would) == ("cancel", "would cancel")
    assert action_title("kill") == "kill the job (SIGKILL)"
    assert rule_title("zombie") == "GPU memory held by a process of no running job"
    assert rule_title("manual") == "an operator's manual reclaim request"


def test_unknown_ladder_action_names_file_path_and_allowed() -> None:
    text = "rules:\n  idle_allocation:\n    ladder: [{action: notify}, {action: obliterate, after: 1h}]\n"
    with pytest.raises(PolicyError) as exc:
        parse_policy(text, "/etc/gpu-cost/policy.yaml")
    msg = str(exc.value)
    assert msg.startswith("/etc/gpu-cost/policy.yaml: rules.idle_allocation.ladder[1].action: must be one of ")
    assert "'obliterate'" in msg and all(repr(a) in msg for a in OLD_LADDER)
    assert "'power_down'" not in msg.split("got")[0]  # not a ladder action


@pytest.fixture
def fake_action() -> Iterator[str]:
    """A destructive job action registered for one test, then forgotten."""
    calls: list[Decision] = []
    spec = ActionSpec(
        "suspend", rank=6, title="suspend the job", verb="suspend", targets=("job",),
        category=("holds", "Holds / requeues"), destructive=True, ladder=True,
        doc="Suspend a running job (``scontrol suspend <id>``).",
        example="ladder: [{action: notify}, {action: suspend, after: 1h}]",
    )

    @register(spec)
    def suspend(d, ctx):  # type: ignore[no-untyped-def]
        calls.append(d)

    try:
        yield "suspend"
    finally:
        registry.remove("suspend")
        EXECUTORS.pop("suspend", None)
    assert "suspend" not in DESTRUCTIVE_ACTIONS and "suspend" not in LADDER_ACTIONS


def test_a_registered_action_is_valid_on_a_ladder_and_known_to_the_engine(fake_action: str) -> None:
    policy = parse_policy(
        "mode: enforce\n"
        "rules:\n  idle_allocation:\n    ladder: [{action: notify}, {action: suspend, after: 1h}]\n",
        "<test>",
    )
    assert [r.action for r in policy.rules.idle_allocation.ladder] == ["notify", "suspend"]
    assert "suspend" in DESTRUCTIVE_ACTIONS and "suspend" in LADDER_ACTIONS and "suspend" not in KILL_ACTIONS
    assert "suspend" in registry.rule_actions("idle_allocation")
    assert "suspend" not in registry.rule_actions("zombie")  # a job action: not for processes
    assert touches_work("suspend")
    d = Decision(decision_id="x", ts=0.0, rule="idle_allocation", target_kind="job", target="job:1",
                 action="suspend", mode="enforce")
    assert d.destructive
    assert "suspend" in dispatch.load_executors()
    assert "| `suspend` |" in registry.reference_markdown()


def test_a_registered_rule_is_known_to_the_engine() -> None:
    def detect(snapshot, cfg, policy):  # type: ignore[no-untyped-def]
        return []

    spec = RuleSpec(
        "stuck_io", config=IdleAllocationRule, target="job", title="a job stuck on I/O", label="Stuck on I/O",
        doc="A job whose GPUs wait on I/O.", example="rules: {stuck_io: {window: 15m}}",
        why=lambda f: f"job {f.job_id}: stuck on I/O", window=lambda cfg, policy: cfg.window,
    )
    register_rule(spec)(detect)
    try:
        policy = parse_policy("", "<test>")
        assert "stuck_io" in registry.rules()
        assert policy.rule("stuck_io").ladder == IdleAllocationRule().ladder
        assert "cancel" in registry.rule_actions("stuck_io")
        f = Finding(rule="stuck_io", target_kind="job", target="job:7", action="notify", gpus=1, job_id="7",
                    user="ann", evidence={})
        plan = decide([f], policy, now=1000.0, escalations={}, total_gpus=64)
        assert [d.rule for d in plan.decisions] == ["stuck_io"]
        assert plan.decisions[0].reason.startswith("job 7: stuck on I/O")
        assert "| `stuck_io` |" in registry.reference_markdown()
    finally:
        registry.remove("stuck_io")
    assert "stuck_io" not in registry.rules()


def test_a_rule_that_finds_idle_jobs_says_so_and_its_window_is_read_before_a_cancel() -> None:
    """A deployment's rule registered with ``idle_jobs`` is one of the rules whose idle jobs' nodes a sweep checks
    and whose logs it reads, over its own window and threshold; one without a ``util_max`` cannot say so."""
    import numpy as np

    from gpu_cost.perceive.live import idle_rows

    spec = RuleSpec(
        "stuck_io", config=IdleAllocationRule, target="job", title="a job stuck on I/O", label="Stuck on I/O",
        doc="A job whose GPUs wait on I/O.", example="rules: {stuck_io: {window: 15m}}",
        why=lambda f: f"job {f.job_id}: stuck on I/O", window=lambda cfg, policy: cfg.window, idle_jobs=True,
    )
    register_rule(spec)(lambda snapshot, cfg, policy: [])
    try:
        policy = parse_policy("rules: {stuck_io: {window: 1h, util_max: 9}}\n", "<test>")
        asked: list[float] = []

        def columns(window: float) -> tuple[np.ndarray, np.ndarray]:
            asked.append(window)
            return np.zeros(3, dtype=bool), np.array([4.0, 8.0, 12.0])

        rows = idle_rows(columns, policy)
        # the shipped idle-allocation (15 min, 5 %) and idle-interactive (2 h, 5 %) rules, and this one (1 h, 9 %)
        assert sorted(asked) == [900.0, 3600.0, 7200.0]
        assert sorted(r.tolist() for r in rows) == [[True, False, False], [True, False, False], [True, True, False]]
    finally:
        registry.remove("stuck_io")

    @dataclasses.dataclass(frozen=True)
    class NoThreshold:
        window: float = 900.0

    with pytest.raises(ValueError, match=r"finds idle jobs \(idle_jobs\) but its config has no util_max"):
        registry.add_rule(dataclasses.replace(spec, config=NoThreshold))
    assert "stuck_io" not in registry.rules()


def test_a_steady_block_reads_the_module_settings_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the decision over a sweep's findings looks actions up per finding: the settings are read on entering
    with registry.steady():
        monkeypatch.setenv(registry.RULE_MODULES_SETTING, "gpu_cost_no_such_module")
        assert "idle_allocation" in registry.rules()  # not read again inside the block
        assert "cancel" in DESTRUCTIVE_ACTIONS
        spec = RuleSpec("stuck_io", config=IdleAllocationRule, target="job", title="t", label="l", doc="d",
                        example="rules: {stuck_io: {}}", why=lambda f: "", window=lambda cfg, policy: cfg.window)
        register_rule(spec)(lambda snapshot, cfg, policy: [])
        try:
            assert "stuck_io" in registry.rules()  # a registration in the block is seen at once
        finally:
            registry.remove("stuck_io")
    with pytest.raises(ImportError, match="gpu_cost_no_such_module"):
        registry.rules()  # out of the block, every read follows the setting again
    monkeypatch.delenv(registry.RULE_MODULES_SETTING)
    assert "idle_allocation" in registry.rules()


def test_generated_reference_is_current() -> None:
    expected = registry.reference_markdown()
    assert REFERENCE.exists(), f"missing {REFERENCE}: .venv/bin/python -m gpu_cost.core.registry > {REFERENCE}"
    assert REFERENCE.read_text(encoding="utf-8") == expected, (
        "docs/reference/actions-and-rules.md drifted from the registry; regenerate it with "
        ".venv/bin/python -m gpu_cost.core.registry > docs/reference/actions-and-rules.md"
    )
