"""The one registry of actions and rules: each is declared once, next to its code.

An action is declared by its executor module (``gpu_cost.act.slurm`` …) with
``@register(ActionSpec(...))`` from :mod:`gpu_cost.act.base`; a rule by its rule module
(``gpu_cost.analyse.rules.zombie`` …) with ``@register(RuleSpec(...))`` from :mod:`gpu_cost.analyse.rules`.
A rule module is the whole rule: its detector, its settings dataclass (fields, defaults, its
ladder's default, validation in ``RuleSpec.check``) and its wording. An executor module is the whole
action the same way: its executor, its wording and, when it has settings, their dataclass and
validation (``ActionSpec.config`` and ``check``: ``demote:`` is :class:`gpu_cost.act.slurm.DemoteConfig`).
The policy's ``rules:`` section (:class:`gpu_cost.config.schema.Rules`), its top-level action
sections (:class:`gpu_cost.config.schema.Actions`), the references and the documentation's rules
table are built from the registered specs. Everything that used to repeat an action's or a rule's
name is derived from here: which actions are destructive, end a job, are notices, free GPUs, may
stand on a ladder or the manual form, how messages and the report name them, why a finding was
raised (cloud-custodian's ``c7n/registry.py`` is the model).

Rules are discovered, not listed: every module of the package :data:`RULE_PACKAGE`, plus the
modules a deployment names in the ``GPU_COST_RULE_MODULES`` setting (comma-separated module
names on the workers' ``sys.path``, e.g. ``site_rules.gpu_hog``). Adding a rule is one module
plus its entry in the policy. Actions come from the one list :data:`ACTION_MODULES` (the registry
and dispatch both load it; scanning the whole ``gpu_cost.act`` package would import dispatch and
the audit store whenever a policy is read), plus those named in ``GPU_COST_ACTION_MODULES``.

This module imports nothing of the project: :mod:`gpu_cost.core.model` imports it, and the executor
and rule modules (which import the model) are loaded on first use. The derived name sets
(:func:`names`, :func:`by_kind`) are live views: they load the modules when first read and follow
later registrations (a plugin's, a test's).

The reference page ``docs/reference/actions-and-rules.md`` is :func:`reference_markdown`'s output;
regenerate it with ``.venv/bin/python -m gpu_cost.core.registry > docs/reference/actions-and-rules.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

#: target kinds an action may apply to
KINDS = ("job", "user", "process", "node", "reservation", "agent")

#: the modules that declare the shipped actions (importing one registers its actions and executors):
#: the one list the registry and dispatch load
ACTION_MODULES = ("gpu_cost.act.notify", "gpu_cost.act.slurm", "gpu_cost.act.node", "gpu_cost.act.power",
                  "gpu_cost.act.reservation", "gpu_cost.act.ops")
#: the package whose every module is loaded for rules (a module that registers none is a helper)
RULE_PACKAGE = "gpu_cost.analyse.rules"
#: the settings (environment variables) naming a deployment's own rule and action modules, comma-separated
RULE_MODULES_SETTING = "GPU_COST_RULE_MODULES"
ACTION_MODULES_SETTING = "GPU_COST_ACTION_MODULES"

#: the cluster sources a policy's ``sweep.source`` and ``forecast.source`` name, by module. The simulator
#: is one of them, a plug-in chosen by name as actions and rules are: the loop and the forecasts never
#: import the simulation room, the simulation imports them.
SOURCE_MODULES = {"sim": "gpu_cost.sim.cluster", "prometheus": "gpu_cost.perceive.live",
                  "trace": "gpu_cost.perceive.trace"}


def source(name: str) -> Any:
    """Return the module of the cluster source ``name`` (imported on first use)."""
    try:
        return importlib.import_module(SOURCE_MODULES[name])
    except KeyError:
        raise ValueError(f"unknown source {name!r} (use {', '.join(SOURCE_MODULES)})") from None


@dataclass(frozen=True)
class ActionSpec:
    """What the policy, the engine, the messages and the report know about one action.

    :param name: the policy's and the audit trail's name for it.
    :param rank: mildest first; orders every derived list (ladders, the form, the report).
    :param title: what a message calls it ("cancel the job").
    :param verb: the report's verb ("cancel"; a dry-run says "would cancel").
    :param doc: what it does, one or two sentences.
    :param example: a YAML example of its use in a policy.
    :param targets: the target kinds it applies to (``job``, ``user``, ``process``, ``node``, ``reservation``).
    :param destructive: it takes resources away from someone (caps, approvals, dry-run brakes).
    :param notice: it only tells people (advice, notice, escalation).
    :param ends_job: it ends a job or a process (the kill family).
    :param final: nothing may follow it on a ladder: the target is gone.
    :param frees_gpus: its success gives GPUs back (the savings ledger, the report's dry-run estimate).
    :param ladder: a rule's ladder may use it.
    :param form: the manual reclaim form offers it.
    :param then: when set, the only actions that may follow it on a ladder.
    :param category: the report's event category as ``(key, label)``.
    :param config: its settings' dataclass, declared in its module (fields, defaults and, with ``#:``
        comments, the reference's descriptions): the policy's top-level section ``section``. None: no settings.
    :param section: the policy's key for those settings (default: the action's name); actions carried out by
        one executor may share one section (the same ``config``).
    :param check: ``(config, policy) -> None``, what the section's types cannot check; it raises
        :class:`gpu_cost.config.typed.Invalid` naming the key inside the section (``""``: the section),
        which the loader reports as ``<file>: <section>.<key>: <reason>``.
    """

    name: str
    rank: int
    title: str
    verb: str
    doc: str
    example: str
    targets: tuple[str, ...]
    category: tuple[str, str]
    destructive: bool = False
    notice: bool = False
    ends_job: bool = False
    final: bool = False
    frees_gpus: bool = False
    ladder: bool = False
    form: bool = False
    then: tuple[str, ...] | None = None
    config: type | None = None
    section: str | None = None
    check: Callable[[Any, Any], None] | None = None

    def __post_init__(self) -> None:
        if self.config is None and (self.section is not None or self.check is not None):
            raise ValueError(f"action {self.name!r}: a settings section or check needs its config dataclass")
        if self.config is not None and self.section is None:
            object.__setattr__(self, "section", self.name)

    @property
    def would(self) -> str:
        """The dry-run verb: ``would cancel``."""
        return f"would {self.verb}"

    @property
    def touches_work(self) -> bool:
        """Destructive on running work (a job, a process): its GPUs count in the GPU-share caps.
        Powering a node down or changing a reservation touches no running job."""
        return self.destructive and any(k not in ("node", "reservation") for k in self.targets)


@dataclass(frozen=True)
class RuleSpec:
    """What the policy, the engine, the messages and the report know about one rule.

    :param name: the policy's key under ``rules:`` and the findings' ``rule`` (a lower-case identifier).
    :param config: its policy section's dataclass, declared in the rule's module: fields, defaults (the
        ladder's default included) and, with ``#:`` comments, the reference's descriptions.
    :param target: the kind of target its findings name (``job``, ``process``): decides which
        ladder actions it may use.
    :param title: what a message calls a finding of it.
    :param label: the report's label for it.
    :param doc: what it finds, one or two sentences.
    :param example: a YAML example of its policy section.
    :param why: the decision's reason for a finding.
    :param window: the metrics window (seconds) it reads, given its config and the policy.
    :param advice_only: its ladder may only hold notices (it never acts on work).
    :param idle_jobs: it finds running jobs whose allocated GPUs are idle, each GPU fresh and under its config's
        ``util_max`` over its window, and may end them: a sweep checks the GPU numbering of the nodes of the jobs it
        may find so and reads their logs first (:func:`gpu_cost.perceive.live.idle_rows`), and a replay judges its
        kills by that threshold and window.
    :param rank: orders the rules (the snapshot's primary window is the first rule's, the references
        list them in this order); a deployment's rule keeps the default and comes after the shipped ones.
    :param check: ``(config, policy) -> None``, what the section's types cannot check (names, a
        setting against another section); it raises :class:`gpu_cost.config.typed.Invalid` naming the
        key inside the section, which the loader reports as ``<file>: rules.<name>.<key>: <reason>``.
    :param detect: the detector ``(snapshot, config, policy) -> findings``; set by the decorator.
    """

    name: str
    config: type
    target: str
    title: str
    label: str
    doc: str
    example: str
    why: Callable[[Any], str]
    window: Callable[[Any, Any], float]
    advice_only: bool = False
    idle_jobs: bool = False
    rank: int = 1000
    check: Callable[[Any, Any], None] | None = None
    detect: Callable[..., Any] | None = None


_ACTIONS: dict[str, ActionSpec] = {}
_RULES: dict[str, RuleSpec] = {}
_version = [0]
_loaded = {"actions": False, "rules": False}
#: each kind's setting naming a deployment's modules
_SETTINGS = {"actions": ACTION_MODULES_SETTING, "rules": RULE_MODULES_SETTING}
#: the value of each setting last loaded (a later value loads the modules it adds)
_setting_seen = {"actions": "", "rules": ""}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: the rules by rank as of registry version ``[0]``
_ranked: list[Any] = [-1, {}]
#: how many :func:`steady` blocks are open: while one is, reads do not look at the settings again
_steady = [0]


def add_action(spec: ActionSpec) -> ActionSpec:
    """Register ``spec``; a second spec under the same name is an error (one declaration each), and so is
    a settings section another action declares with a different dataclass."""
    old = _ACTIONS.get(spec.name)
    if old is not None and _identity(old) != _identity(spec):
        raise ValueError(f"action {spec.name!r} is declared twice")
    bad = set(spec.targets) - set(KINDS)
    if bad:
        raise ValueError(f"action {spec.name!r}: unknown target kind(s) {sorted(bad)}")
    if spec.section is not None:
        if not _NAME.match(spec.section):
            raise ValueError(f"action {spec.name!r}: its section {spec.section!r} is a policy key: "
                             "lower-case letters, digits and _")
        for other in _ACTIONS.values():
            if other.name != spec.name and other.section == spec.section and \
                    _where(other.config) != _where(spec.config):
                raise ValueError(f"action {spec.name!r}: section {spec.section!r} is action {other.name!r}'s, "
                                 "with another dataclass")
    _ACTIONS[spec.name] = spec
    _version[0] += 1
    return spec


def add_rule(spec: RuleSpec) -> RuleSpec:
    """Register ``spec`` (with its detector); a different spec under the same name is an error."""
    if not _NAME.match(spec.name):
        raise ValueError(f"rule {spec.name!r}: a rule's name is a policy key: lower-case letters, digits and _")
    if spec.idle_jobs and "util_max" not in {f.name for f in dataclasses.fields(spec.config)}:
        raise ValueError(f"rule {spec.name!r} finds idle jobs (idle_jobs) but its config has no util_max: the "
                         "threshold a sweep and a replay read its idle GPUs by")
    old = _RULES.get(spec.name)
    if old is not None and (old.config, _where(old.detect)) != (spec.config, _where(spec.detect)):
        raise ValueError(f"rule {spec.name!r} is declared twice")
    _RULES[spec.name] = spec
    _version[0] += 1
    return spec


def _where(fn: Any) -> tuple[str, str]:
    return (getattr(fn, "__module__", ""), getattr(fn, "__qualname__", ""))


def _identity(spec: ActionSpec) -> tuple[Any, ...]:
    """An action's declaration, its classes and functions by where they are defined (a module imported
    again declares the same action)."""
    return (dataclasses.replace(spec, config=None, section=None, check=None), spec.section,
            _where(spec.config), _where(spec.check))


def remove(name: str) -> None:
    """Forget an action or rule (tests and plugins that registered one for a while)."""
    _ACTIONS.pop(name, None)
    _RULES.pop(name, None)
    _version[0] += 1


@contextlib.contextmanager
def steady() -> Iterator[None]:
    """Read the module settings once, on entry, for the block (a decorator too): a phase that looks up actions
    and rules hundreds of thousands of times (the decision over every finding of a sweep) reads the process
    environment once, not at every lookup. Registrations in the block are seen as always."""
    _load("actions")
    _load("rules")
    _steady[0] += 1
    try:
        yield
    finally:
        _steady[0] -= 1


def _load(kind: str) -> None:
    if _steady[0] and _loaded[kind]:
        return  # read on entering the open steady() block
    name = _SETTINGS[kind]
    setting = os.environ.get(name, "")
    if setting != _setting_seen[kind]:
        for mod in setting_modules(setting):
            _import_named(mod, name)  # a module already imported registers nothing again
        _setting_seen[kind] = setting  # after: a module that cannot be imported is an error on every read
    if _loaded[kind]:
        return
    _loaded[kind] = True
    for mod in ACTION_MODULES if kind == "actions" else rule_modules(deployment=False):
        importlib.import_module(mod)


def setting_modules(setting: str | None = None, name: str = RULE_MODULES_SETTING) -> tuple[str, ...]:
    """Return the module names in the setting ``name`` (its value ``setting``, else the environment's)."""
    if setting is None:
        setting = os.environ.get(name, "")
    return tuple(m for m in (part.strip() for part in setting.replace(";", ",").split(",")) if m)


def _import_named(mod: str, setting: str) -> None:
    try:
        importlib.import_module(mod)
    except ImportError as exc:
        raise ImportError(f"{setting} names {mod!r}, which cannot be imported: {exc}") from exc


def rule_modules(*, deployment: bool = True) -> tuple[str, ...]:
    """Return the modules rules are loaded from: every module of :data:`RULE_PACKAGE` (sorted), then,
    with ``deployment``, those named in the ``GPU_COST_RULE_MODULES`` setting."""
    package = importlib.import_module(RULE_PACKAGE)
    found = tuple(f"{RULE_PACKAGE}.{m.name}" for m in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name)
                  if not m.name.startswith("_"))
    return found + (setting_modules() if deployment else ())


def action_modules(*, deployment: bool = True) -> tuple[str, ...]:
    """Return the modules actions are loaded from: :data:`ACTION_MODULES`, then, with ``deployment``,
    those named in the ``GPU_COST_ACTION_MODULES`` setting."""
    return ACTION_MODULES + (setting_modules(name=ACTION_MODULES_SETTING) if deployment else ())


def actions() -> dict[str, ActionSpec]:
    """Every registered action, mildest first."""
    _load("actions")
    return dict(sorted(_ACTIONS.items(), key=lambda kv: (kv[1].rank, kv[0])))


def action_sections() -> dict[str, ActionSpec]:
    """The actions' settings sections (the policy's top-level keys such as ``demote``) → the mildest
    action that declares each, mildest first."""
    out: dict[str, ActionSpec] = {}
    for spec in actions().values():
        if spec.section is not None:
            out.setdefault(spec.section, spec)
    return out


def rules() -> dict[str, RuleSpec]:
    """Every registered rule, by rank (the shipped rules' order), then in registration order."""
    return dict(_rules())


def _rules() -> dict[str, RuleSpec]:
    """:func:`rules` itself, shared, not a copy (the engine asks a rule's spec per finding): read it only."""
    _load("rules")
    if _ranked[0] != _version[0]:
        order = {name: i for i, name in enumerate(_RULES)}
        _ranked[1] = dict(sorted(_RULES.items(), key=lambda kv: (kv[1].rank, order[kv[0]])))
        _ranked[0] = _version[0]
    found: dict[str, RuleSpec] = _ranked[1]
    return found


def action(name: str) -> ActionSpec | None:
    return actions().get(name)


def rule(name: str) -> RuleSpec | None:
    return _rules().get(name)


def _select(flags: Mapping[str, Any]) -> tuple[str, ...]:
    out = []
    for name, spec in actions().items():
        if all(getattr(spec, k) == v if k != "target" else v in spec.targets for k, v in flags.items()):
            out.append(name)
    return tuple(out)


class Names(AbstractSet[str]):
    """A live, ordered, read-only set of action names selected by spec attributes.

    Built at import time without importing anything; read (``in``, iteration, ``len``) it loads
    the registry and follows later registrations. Iteration is mildest first.
    """

    def __init__(self, extra: tuple[str, ...] = (), **flags: Any) -> None:
        self._extra = extra
        self._flags = flags
        self._seen = -1
        self._cache: tuple[str, ...] = ()
        self._set: frozenset[str] = frozenset()

    def _names(self) -> tuple[str, ...]:
        _load("actions")
        if self._seen != _version[0]:
            found = self._extra + _select(self._flags)
            self._cache, self._set = found, frozenset(found)
            self._seen = _version[0]  # last: a reader that sees it current sees both forms
        return self._cache

    def __contains__(self, x: object) -> bool:
        if not (_steady[0] and self._seen == _version[0]):
            self._names()  # in a steady block, with nothing registered since, the set is current
        return x in self._set

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __getitem__(self, i: int) -> str:
        return self._names()[i]

    def __repr__(self) -> str:
        return f"Names({', '.join(self._names())})"

    @classmethod
    def _from_iterable(cls, it: Any) -> frozenset[str]:  # type: ignore[override]
        return frozenset(it)


def names(**flags: Any) -> Names:
    """Return the live set of actions whose spec attributes equal ``flags`` (``target=`` tests the kinds)."""
    return Names(**flags)


class ByKind(Mapping[str, tuple[str, ...]]):
    """A live mapping of target kind → the actions (selected by ``flags``) that apply to it."""

    def __init__(self, kinds: tuple[str, ...], **flags: Any) -> None:
        self._kinds = kinds
        self._flags = flags

    def __getitem__(self, kind: str) -> tuple[str, ...]:
        if kind not in self._kinds:
            raise KeyError(kind)
        return _select({**self._flags, "target": kind})

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)


def by_kind(kinds: tuple[str, ...] = KINDS, **flags: Any) -> ByKind:
    return ByKind(kinds, **flags)


def rule_actions(name: str) -> frozenset[str]:
    """The ladder actions rule ``name`` may use: those for its target kind (only notices when advice-only)."""
    spec = rules()[name]
    return frozenset(
        a for a, s in actions().items()
        if s.ladder and spec.target in s.targets and (s.notice or not spec.advice_only)
    )


def categories() -> tuple[tuple[str, str, frozenset[str]], ...]:
    """The report's event categories ``(key, label, actions)``, mildest first."""
    out: dict[tuple[str, str], set[str]] = {}
    for name, spec in actions().items():
        out.setdefault(spec.category, set()).add(name)
    return tuple((k, label, frozenset(v)) for (k, label), v in out.items())


def why(finding: Any) -> str:
    """The decision reason for a finding: its rule's ``why``, or a plain one for a rule-less finding."""
    spec = _rules().get(finding.rule)
    return spec.why(finding) if spec is not None else f"{finding.rule} on {finding.target}"


def _doc(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _yaml(example: str) -> str:
    return "<code>" + _cell(inspect.cleandoc(example)).replace(" ", "&nbsp;") + "</code>"


def reference_markdown() -> str:
    """Return the Markdown reference of every action and rule (``docs/reference/actions-and-rules.md``)."""
    lines = [
        "# Actions and rules",
        "",
        "<!-- Generated from plugins/gpu_cost/core/registry.py: do not edit. Regenerate with",
        "     .venv/bin/python -m gpu_cost.core.registry > docs/reference/actions-and-rules.md",
        "     (tests/unit/test_registry.py fails when this file drifts from the registry). -->",
        "",
        "## Actions",
        "",
        "| action | what it does | applies to | destructive | ends the job | frees GPUs | ladder | form | settings "
        "| YAML example |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    yes = {True: "yes", False: "no"}
    for name, a in actions().items():
        settings = f"`{a.section}:`" if a.section else ""
        lines.append(
            f"| `{name}` | {_cell(_doc(a.doc))} | {', '.join(a.targets)} | {yes[a.destructive]} | {yes[a.ends_job]} "
            f"| {yes[a.frees_gpus]} | {yes[a.ladder]} | {yes[a.form]} | {settings} | {_yaml(a.example)} |"
        )
    lines += [
        "",
        "## Rules",
        "",
        "| rule | what it finds | target | ladder actions | YAML example |",
        "|---|---|---|---|---|",
    ]
    for name, r in rules().items():
        allowed = ", ".join(a for a in actions() if a in rule_actions(name))
        lines.append(f"| `{name}` | {_cell(_doc(r.doc))} | {r.target} | {allowed} | {_yaml(r.example)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    from gpu_cost.core.registry import reference_markdown as _reference  # the registered module, not __main__

    print(_reference(), end="")
