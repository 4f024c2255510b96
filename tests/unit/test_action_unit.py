"""An action is one unit (issue 35): its executor module holds the executor, its settings section
(dataclass, defaults, validation) and its wording, and nothing else has to name it.

The test writes a new action with a settings section of its own into a temporary package (a deployment's
own actions, on ``sys.path``), names it in the ``GPU_COST_ACTION_MODULES`` setting, and shows that the
policy validates its top-level section (a bad value is named ``<section>.<key>``), that a ladder may use
it and dispatch finds and runs its executor with the policy's settings, and that the generated references
list it, while no file of the repository names it. The shipped ``demote:`` section is declared the same
way, by :mod:`gpu_cost.act.slurm`.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_cost.act import dispatch
from gpu_cost.cli import docgen
from gpu_cost.config.loader import load_policy
from gpu_cost.config.schema import Policy
from gpu_cost.core import registry
from gpu_cost.core.errors import PolicyError
from tests.fixtures.core import NOW, ROOT
from tests.unit.policy.helpers import job_finding, sweep_once

ACTION = "slow_clocks"

#: the whole action: its settings (fields, defaults, bounds, a check), its executor, its words
MODULE = '''
"""Slow a job's GPUs down to a clock cap (a stand-in executor for the test: it reaches nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from gpu_cost.act.base import ActionContext, Outcome, register
from gpu_cost.config.schema import Policy
from gpu_cost.config.typed import Invalid, Range
from gpu_cost.core.model import Decision
from gpu_cost.core.registry import ActionSpec


@dataclass(frozen=True)
class SlowClocksConfig:
    """How ``slow_clocks`` slows a job: the clock its GPUs are capped at."""

    #: the GPU clock cap, MHz
    max_clock_mhz: Annotated[int, Range(100, 5000)] = 1000
    #: the reason recorded with the cap
    reason: str = "gpu-cost: slowed"


def check(cfg: SlowClocksConfig, policy: Policy) -> None:
    if not cfg.reason.startswith("gpu-cost"):
        raise Invalid("reason", f"{cfg.reason!r} must start with gpu-cost (the agent finds its own caps by it)")


@register(ActionSpec(
    "slow_clocks", rank=4, title="slow the job's GPUs", verb="slow", targets=("job",),
    category=("slowed", "Slowed jobs"), destructive=True, ladder=True, config=SlowClocksConfig, check=check,
    doc="Cap a job's GPU clocks.", example="ladder: [{action: slow_clocks, after: 1h}]",
))
def slow_clocks(d: Decision, ctx: ActionContext) -> Outcome:
    cfg: SlowClocksConfig = ctx.policy.actions["slow_clocks"]
    command = f"cap {d.target} at {cfg.max_clock_mhz} MHz ({cfg.reason})"
    return Outcome("skipped" if ctx.dry_run else "succeeded", command=command)
'''

ENTRY = """
slow_clocks:                # a deployment's own action's settings
  max_clock_mhz: 800
"""


@pytest.fixture
def site_action(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The new action's package on ``sys.path``, named in the setting; forgotten afterwards."""
    package = tmp_path / "site_actions"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / f"{ACTION}.py").write_text(textwrap.dedent(MODULE).lstrip(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.ACTION_MODULES_SETTING, f"site_actions.{ACTION}")
    try:
        yield tmp_path
    finally:
        registry.remove(ACTION)
        dispatch.REGISTRY.pop(ACTION, None)
        for name in (f"site_actions.{ACTION}", "site_actions"):
            sys.modules.pop(name, None)


def _policy_with(tmp_path: Path, entry: str, name: str = "policy.yaml") -> Path:
    shipped = (ROOT / "include" / "policy" / "default.yaml").read_text(encoding="utf-8")
    path = tmp_path / name
    path.write_text(shipped + entry, encoding="utf-8")
    return path


def test_a_new_action_is_one_module_with_its_settings(site_action: Path, store) -> None:  # type: ignore[no-untyped-def]
    # the policy loads the action's top-level section, typed and checked by the action's own dataclass
    policy = load_policy(_policy_with(site_action, ENTRY))
    assert ACTION in registry.actions() and ACTION in registry.action_sections()
    cfg = policy.actions[ACTION]
    assert (cfg.max_clock_mhz, cfg.reason) == (800, "gpu-cost: slowed") and policy.actions.slow_clocks is cfg
    assert policy.demote.nice == 10000  # the shipped actions' sections are untouched
    assert Policy().actions[ACTION].max_clock_mhz == 1000  # left out: the defaults of its module

    # bad values are refused naming the file and <section>.<key>: its bounds, its keys, its own check
    for entry, where, reason in (
        ("slow_clocks: {max_clock_mhz: 50}\n", "slow_clocks.max_clock_mhz", "must be ≥ 100, got 50"),
        ("slow_clocks: {max_clock: 800}\n", "slow_clocks.max_clock", "unknown key (did you mean 'max_clock_mhz'?)"),
        ("slow_clocks: {reason: slowed}\n", "slow_clocks.reason", "'slowed' must start with gpu-cost"),
        ("slow_clock: {max_clock_mhz: 800}\n", "slow_clock", "unknown key (did you mean 'slow_clocks'?)"),
    ):
        bad = _policy_with(site_action, "\n" + entry, "bad.yaml")
        with pytest.raises(PolicyError) as exc:
            load_policy(bad)
        assert str(exc.value).startswith(f"{bad}: {where}: {reason}"), str(exc.value)

    # a ladder may use it, and dispatch finds its executor and runs it with the policy's settings
    ladder = "rules:\n  idle_allocation:\n    ladder: [{action: slow_clocks}]\n"
    text = (f"mode: enforce\n{ladder}approval: {{gpu_hours_at_risk: 1000}}\n"
            f"slow_clocks: {{max_clock_mhz: 700, reason: 'gpu-cost: night'}}\n")
    acting = load_policy(_write(site_action / "acting.yaml", text))
    assert dispatch.load_executors()[ACTION].__module__ == f"site_actions.{ACTION}"
    plan = sweep_once(store, acting, [job_finding("7", now=NOW)], NOW)
    (d,) = plan.decisions
    assert d.action == ACTION
    (row,) = store.actions_of_decision(d.decision_id)
    assert (row["status"], row["executor"]) == ("succeeded", f"site_actions.{ACTION}")
    assert "$ cap job:7 at 700 MHz (gpu-cost: night)" in row["output"]

    # the generated references list it: the policy reference, the registry's page
    assert f"| `{ACTION}.max_clock_mhz` | integer | 100 – 5000 | `1000` | the GPU clock cap, MHz |" \
        in docgen.policy_markdown()
    assert f"| `{ACTION}:` |" in registry.reference_markdown()  # its settings column names its section

    # and no file of the repository had to name it
    named = [str(p.relative_to(ROOT)) for folder in ("plugins", "include", "docs")
             for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".md")
             and ACTION in p.read_text(encoding="utf-8", errors="replace")]
    assert named == []


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_demote_is_declared_by_its_executor_module(tmp_path: Path) -> None:
    from gpu_cost.act import slurm

    spec = registry.action("demote")
    assert spec is not None and spec.config is slurm.DemoteConfig and spec.section == "demote"
    assert registry.action_sections()["demote"] is spec
    policy = load_policy(_write(tmp_path / "p.yaml", "demote: {nice: 500, qos: preemptible}\n"))
    assert policy.demote == policy.actions["demote"] == slurm.DemoteConfig(nice=500, qos="preemptible")
    bad = _write(tmp_path / "bad.yaml", "demote: {nice: -1}\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(bad)
    assert str(exc.value).startswith(f"{bad}: demote.nice: must be ≥ 0, got -1"), str(exc.value)


def test_an_action_module_that_cannot_be_imported_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.ACTION_MODULES_SETTING, "site_actions_missing.nothing")
    with pytest.raises(ImportError, match=r"GPU_COST_ACTION_MODULES names 'site_actions_missing.nothing'"):
        registry.actions()
    monkeypatch.delenv(registry.ACTION_MODULES_SETTING)
    assert ACTION not in registry.actions() and "demote" in registry.actions()
