"""A rule is one unit (issue 35): one module, plus its entry in the policy, and nothing else.

The test writes a new rule module into a temporary package (a deployment's own rules, on ``sys.path``),
names it in the ``GPU_COST_RULE_MODULES`` setting, adds its entry to a copy of the shipped policy, and
shows that the policy loads it with its settings checked, that the sweep's detection runs it and its
findings reach the engine, and that the generated documentation lists it, while no file of the
repository names it.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_cost.cli import docgen
from gpu_cost.config.loader import load_policy
from gpu_cost.core import registry
from gpu_cost.core.errors import PolicyError
from gpu_cost.decide.engine import decide
from gpu_cost.loop.sweep import detect
from gpu_cost.perceive.snapshot import from_matrix
from gpu_cost.sim.cluster import SimCluster, scenario_from_dict
from tests.fixtures.core import NOW, ROOT

RULE = "stuck_io"

#: the whole rule: its settings (fields, defaults, bounds, the ladder's default, a check), its detector, its words
MODULE = '''
"""Stuck on I/O: a job holding at least ``min_gpus`` GPUs (a stand-in detector for the test)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from gpu_cost.analyse.rules import register
from gpu_cost.config.schema import Mode, Policy, Rung
from gpu_cost.config.typed import Invalid, Range
from gpu_cost.core.model import Finding, Snapshot
from gpu_cost.core.registry import RuleSpec


@dataclass(frozen=True)
class StuckIoRule:
    """A job whose GPUs wait on storage."""

    enabled: bool = True
    mode: Mode | None = None
    #: a job holding at least this many GPUs is looked at
    min_gpus: Annotated[int, Range(1, 64)] = 1
    #: storage mounts that never count
    ignore_mounts: tuple[str, ...] = ()
    ladder: tuple[Rung, ...] = (Rung("notify", 0.0), Rung("notify_manager", 3600.0))


def check(cfg: StuckIoRule, policy: Policy) -> None:
    for i, mount in enumerate(cfg.ignore_mounts):
        if not mount.startswith("/"):
            raise Invalid(f"ignore_mounts[{i}]", f"{mount!r} is not an absolute path")


def why(f: Finding) -> str:
    return f"job {f.job_id}: {f.gpus} GPU(s) wait on storage"


SPEC = RuleSpec(
    "stuck_io", config=StuckIoRule, target="job", title="a job stuck on I/O", label="Stuck on I/O",
    doc="A job whose GPUs wait on storage.", example="rules: {stuck_io: {min_gpus: 2}}",
    why=why, window=lambda cfg, policy: 900.0, check=check,
)


@register(SPEC)
def stuck_io(snapshot: Snapshot, cfg: StuckIoRule, policy: Policy) -> list[Finding]:
    return [Finding(rule="stuck_io", target_kind="job", target=f"job:{j.job_id}", action="notify", gpus=j.gpu_count,
                    user=j.user, job_id=j.job_id, evidence={"min_gpus": cfg.min_gpus})
            for j in snapshot.running_jobs() if j.gpu_count >= cfg.min_gpus]
'''

ENTRY = """\
  stuck_io:               # a deployment's own rule
    min_gpus: 2
    ignore_mounts: [/scratch]
"""


@pytest.fixture
def site_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The new rule's package on ``sys.path``, named in the setting; forgotten afterwards."""
    package = tmp_path / "site_rules"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / f"{RULE}.py").write_text(textwrap.dedent(MODULE).lstrip(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.RULE_MODULES_SETTING, f"site_rules.{RULE}")
    try:
        yield tmp_path
    finally:
        registry.remove(RULE)
        for name in (f"site_rules.{RULE}", "site_rules"):
            sys.modules.pop(name, None)


def _policy_with(tmp_path: Path, entry: str, name: str = "policy.yaml") -> Path:
    shipped = (ROOT / "include" / "policy" / "default.yaml").read_text(encoding="utf-8")
    assert "\nrules:\n" in shipped
    path = tmp_path / name
    path.write_text(shipped.replace("\nrules:\n", "\nrules:\n" + entry, 1), encoding="utf-8")
    return path


def _snapshot(policy):  # type: ignore[no-untyped-def]
    node = {"name": "g1", "gpus": 4, "model": "a100", "mem_total_mib": 40960}
    jobs = [{"job_id": "1", "user": "u", "account": "acct", "node": "g1", "gpus": [0, 1], "start": "-3h",
             "name": "train", "behaviour": "training"},
            {"job_id": "2", "user": "v", "account": "acct", "node": "g1", "gpus": [2], "start": "-3h",
             "name": "small", "behaviour": "training"}]
    cluster = SimCluster(scenario_from_dict({"seed": 3, "anchor": "now", "nodes": [node], "jobs": jobs}), anchor=NOW)
    m = cluster.matrix(NOW - policy.sweep.lookback, NOW)
    return from_matrix(policy=policy, now=NOW, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids,
                       models=m.models, mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem, power=m.power,
                       job=m.job, jobs=cluster.jobs_at(NOW), processes=cluster.processes_at(NOW),
                       nodes=cluster.nodes_at(NOW))


def test_a_new_rule_is_one_module_plus_its_policy_entry(site_rule: Path) -> None:
    # the policy loads the rule's section, typed and checked by the rule's own dataclass
    policy = load_policy(_policy_with(site_rule, ENTRY))
    assert RULE in registry.rules() and list(registry.rules())[:2] == ["zombie", "idle_allocation"]
    cfg = policy.rules[RULE]
    assert (cfg.min_gpus, cfg.ignore_mounts) == (2, ("/scratch",)) and policy.rules.stuck_io is cfg
    assert [r.action for r in cfg.ladder] == ["notify", "notify_manager"]  # its ladder's default, from its module
    assert policy.rules.zombie.window == 900.0  # the shipped rules are untouched

    # bad values are refused naming the file and rules.<name>.<key>: its bounds, its keys, its own check, its ladder
    for entry, where, reason in (
        ("  stuck_io:\n    min_gpus: 0\n", "rules.stuck_io.min_gpus", "must be ≥ 1, got 0"),
        ("  stuck_io:\n    min_gpu: 2\n", "rules.stuck_io.min_gpu", "unknown key (did you mean 'min_gpus'?)"),
        ("  stuck_io:\n    ignore_mounts: [scratch]\n", "rules.stuck_io.ignore_mounts[0]",
         "'scratch' is not an absolute path"),
        ("  stuck_io:\n    ladder: [{action: kill_process}]\n", "rules.stuck_io.ladder[0].action",
         "'kill_process' is not possible for stuck_io"),
    ):
        bad = _policy_with(site_rule, entry, "bad.yaml")
        with pytest.raises(PolicyError) as exc:
            load_policy(bad)
        assert str(exc.value).startswith(f"{bad}: {where}: {reason}"), str(exc.value)

    # the sweep's detection runs it, and its findings reach the engine with its own reason
    findings = [f for f in detect(_snapshot(policy), policy) if f.rule == RULE]
    assert [(f.target, f.gpus) for f in findings] == [("job:1", 2)]  # job 2 holds one GPU: under min_gpus
    plan = decide(findings, policy, now=NOW, escalations={}, total_gpus=4)
    assert [(d.rule, d.target, d.action) for d in plan.decisions] == [(RULE, "job:1", "notify")]
    assert plan.decisions[0].reason.startswith("job 1: 2 GPU(s) wait on storage")

    # the generated documentation lists it: the home page's table, the policy reference, the registry's page
    assert f"| `{RULE}` | A job whose GPUs wait on storage. | `notify`, then `notify_manager` after 1h |" in \
        docgen.rules_table()
    assert f"| `rules.{RULE}.min_gpus` | integer | 1 – 64 | `1` | a job holding at least this many GPUs is looked at |" \
        in docgen.policy_markdown()
    assert f"| `{RULE}` |" in registry.reference_markdown()

    # and no file of the repository had to name it
    named = [str(p.relative_to(ROOT)) for folder in ("plugins", "include", "docs")
             for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".md")
             and RULE in p.read_text(encoding="utf-8", errors="replace")]
    assert named == []


def test_a_rule_module_that_cannot_be_imported_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.RULE_MODULES_SETTING, "site_rules_missing.nothing")
    with pytest.raises(ImportError, match=r"GPU_COST_RULE_MODULES names 'site_rules_missing.nothing'"):
        registry.rules()
    monkeypatch.delenv(registry.RULE_MODULES_SETTING)
    assert RULE not in registry.rules() and "zombie" in registry.rules()
