"""Load and check a policy file; every fault names the file, the path inside it and the reason."""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpu_cost.config.schema import Policy, Window
from gpu_cost.config.typed import Invalid, build
from gpu_cost.core import paths, registry
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.globs import any_glob
from gpu_cost.core.timeutil import format_duration

_HHMM = re.compile(r"^([01]\d|2[0-4]):([0-5]\d)$")

def load_policy(path: str | Path | None = None) -> Policy:
    """Load the policy at ``path`` (default: ``GPU_COST_POLICY`` or the shipped ``default.yaml``)."""
    p = Path(path) if path is not None else paths.default_policy()
    source = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(source, "", "file not found") from None
    except OSError as exc:
        raise PolicyError(source, "", f"cannot read: {exc.strerror or exc}") from None
    return parse_policy(text, source)


def parse_policy(text: str, source: str = "<string>") -> Policy:
    """Parse policy YAML text; ``source`` names it in errors."""
    try:
        data = _load_yaml(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(source, where, f"not valid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(source, "(top)", f"must be a mapping of sections, got {type(data).__name__}")
    policy = build(Policy, data, source)
    object.__setattr__(policy, "source", source)
    check_policy(policy, data)
    return policy


def _load_yaml(text: str, source: str) -> Any:
    """Return the YAML document in ``text``; a key given twice in one mapping is a PolicyError.

    PyYAML keeps the last of two equal keys silently, so ``mode: dry-run`` followed by
    ``mode: enforce`` would load as enforce, and a second ``protections: []`` would wipe the first.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_duplicates(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_duplicates(root: yaml.Node, source: str) -> None:
    """Raise PolicyError naming both lines of the earliest key that repeats inside one mapping."""
    dups: list[tuple[int, str, int]] = []  # (line, dotted key, line of the first)
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:  # an alias: already checked where its anchor is
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    stack.append((value, path))  # a merge (<<) may override: that is what it is for
                    continue
                line = key.start_mark.line + 1
                dotted = f"{path}.{key.value}" if path else str(key.value)
                if (key.tag, key.value) in first:
                    dups.append((line, dotted, first[key.tag, key.value]))
                else:
                    first[key.tag, key.value] = line
                stack.append((value, dotted))
    if dups:
        line, dotted, at = min(dups)
        raise PolicyError(source, f"line {line}", f"duplicate key {dotted!r} (first at line {at})")

def check_policy(policy: Policy, raw: dict[str, Any] | None = None) -> None:
    """Check what types cannot: contradictions and absurd values. Raise PolicyError on the first."""
    src = policy.source
    sweep = policy.sweep
    if sweep.max_staleness >= sweep.lookback:
        raise PolicyError(src, "sweep.max_staleness", "must be shorter than sweep.lookback")
    for name, spec in registry.rules().items():
        rule = policy.rule(name)
        base = f"rules.{name}"
        window = getattr(rule, "window", None)
        if window is not None:
            if window < 2 * sweep.sample_interval:
                raise PolicyError(
                    src, f"{base}.window",
                    f"{window:g}s holds fewer than two samples at sweep.sample_interval={sweep.sample_interval:g}s",
                )
            if window > sweep.lookback:
                raise PolicyError(src, f"{base}.window",
                                  f"{format_duration(window)} must not be longer than sweep.lookback "
                                  f"({format_duration(sweep.lookback)}): shorten it, lengthen the lookback, or set "
                                  f"{base}.enabled: false")
        util_max = getattr(rule, "util_max", None)
        if util_max is not None and util_max >= sweep.busy_util:
            raise PolicyError(
                src, f"{base}.util_max",
                f"idle threshold {util_max:g}% is not below the busy threshold sweep.busy_util={sweep.busy_util:g}%",
            )
        if rule.enabled and not rule.ladder:
            raise PolicyError(src, f"{base}.ladder", "an enabled rule needs at least one rung")
        # the ladder actions of the rule's target kind (a zombie is a process: no job to demote or cancel)
        allowed = registry.rule_actions(name)
        for i, rung in enumerate(rule.ladder):
            if rung.action not in allowed:
                raise PolicyError(
                    src, f"{base}.ladder[{i}].action",
                    f"{rung.action!r} is not possible for {name} (allowed: {', '.join(sorted(allowed))})",
                )
        actions = [r.action for r in rule.ladder]
        if "kill" in actions and "terminate" in actions and actions.index("kill") < actions.index("terminate"):
            raise PolicyError(src, f"{base}.ladder", "'kill' comes before 'terminate': SIGKILL before SIGTERM")
        _check_ladder_order(src, base, actions)
        if spec.check is not None:  # what the rule's own module checks: names, its settings against others
            _own_check(spec.check, rule, policy, base)
    for section, action in registry.action_sections().items():
        if action.check is not None:  # what the action's own module checks of its section
            _own_check(action.check, policy.actions[section], policy, section)
    if policy.mode == "enforce" and policy.caps.max_actions_per_run == 0:
        raise PolicyError(src, "caps.max_actions_per_run", "is 0 while mode is enforce: nothing could ever act")
    if policy.mode == "enforce" and policy.caps.max_gpu_share == 0 and _has_destructive(policy):
        raise PolicyError(src, "caps.max_gpu_share", "is 0 while mode is enforce and a ladder has destructive rungs: "
                                                     "every run acting on them would be capped")
    if sweep.keep_parked < policy.approval.timeout + 3600:
        raise PolicyError(src, "sweep.keep_parked",
                          f"{format_duration(sweep.keep_parked)} is shorter than approval.timeout "
                          f"({format_duration(policy.approval.timeout)}) plus an hour: a run awaiting an answer "
                          "would lose the plan and snapshot it acts on")
    if policy.approval.assigned_users and len(set(policy.approval.assigned_users)) != len(policy.approval.assigned_users):
        raise PolicyError(src, "approval.assigned_users", "lists a user twice")
    for j, pat in enumerate(policy.inference.name_patterns):
        if not pat.strip() or pat.strip() == "*":
            raise PolicyError(src, f"inference.name_patterns[{j}]",
                              f"{pat!r} would declare every job an inference service (advice only, never reclaimed)")
    names: set[str] = set()
    for i, prot in enumerate(policy.protections):
        base = f"protections[{i}]"
        if prot.name in names:
            raise PolicyError(src, f"{base}.name", f"duplicate protection name {prot.name!r}")
        names.add(prot.name)
        if prot.match.empty:
            raise PolicyError(src, f"{base}.match", "matches nothing: give at least one of users, accounts, ...")
        for key in ("name_patterns", "nodes"):
            for j, pat in enumerate(getattr(prot.match, key)):
                try:
                    any_glob((pat,))  # what the protections will compile
                except re.error as exc:
                    raise PolicyError(src, f"{base}.match.{key}[{j}]", f"bad pattern: {exc}") from None
    _check_tz(src, "notifications.timezone", policy.notifications.timezone)
    _check_tz(src, "offhours.timezone", policy.offhours.timezone)
    _check_tz(src, "report.timezone", policy.report.timezone)
    wh = policy.notifications.working_hours
    parts = wh.split("-")
    if len(parts) != 2 or not all(_HHMM.match(p.strip()) for p in parts):
        raise PolicyError(src, "notifications.working_hours", f"must look like 09:00-18:00, got {wh!r}")
    if _minutes(parts[0]) >= _minutes(parts[1]):
        raise PolicyError(src, "notifications.working_hours", f"start must be before end, got {wh!r}")
    for i, day in enumerate(policy.notifications.holidays):
        try:
            dt.date.fromisoformat(day)
        except ValueError:
            raise PolicyError(src, f"notifications.holidays[{i}]", f"not a date (YYYY-MM-DD): {day!r}") from None
    if not policy.notifications.working_days:
        raise PolicyError(src, "notifications.working_days", "no working days: notices could never be timed")
    if len(set(policy.notifications.working_days)) != len(policy.notifications.working_days):
        raise PolicyError(src, "notifications.working_days", "lists a day twice")
    if policy.snooze.max_duration < policy.sweep.interval:
        raise PolicyError(src, "snooze.max_duration", "is shorter than sweep.interval: a snooze could never be seen")
    if not [d for d in policy.answers.keep_durations if d <= policy.snooze.max_duration]:
        raise PolicyError(src, "answers.keep_durations",
                          f"none is within snooze.max_duration ({format_duration(policy.snooze.max_duration)}): "
                          "a keep answer is a snooze; offer at least one that fits")
    if policy.answers.base_url and not policy.answers.base_url.startswith(("https://", "http://")):
        raise PolicyError(src, "answers.base_url", f"{policy.answers.base_url!r} is not an http(s) URL")
    for i, w in enumerate(policy.offhours.windows):
        _check_window(src, f"offhours.windows[{i}]", w)
    oh = policy.offhours
    if oh.approval_over_nodes and oh.max_nodes_per_run and oh.approval_over_nodes > oh.max_nodes_per_run:
        # harmless but tells the operator approval can never trigger
        pass
    for user, person in policy.people.items():
        if person.manager == user:
            raise PolicyError(src, f"people.{user}.manager", "a user cannot be their own manager")
        seen = [user]
        boss = person.manager
        while boss is not None and boss in policy.people:
            if boss in seen:
                chain = " → ".join([*seen, boss])
                raise PolicyError(src, f"people.{user}.manager", f"managers form a loop: {chain}")
            seen.append(boss)
            boss = policy.people[boss].manager
    routes = [(f"people.{u}.via", p.via) for u, p in policy.people.items()]
    routes += [(f"notifications.accounts.{a}.via", r.via) for a, r in policy.notifications.accounts.items()]
    for where, via in routes:
        twice = sorted({c for c in via if via.count(c) > 1})
        if twice:
            raise PolicyError(src, where, f"names {', '.join(twice)} twice: a channel is tried once")


def _own_check(check: Callable[[Any, Any], None], cfg: Any, policy: Policy, base: str) -> None:
    """Run a rule's or an action's own ``check`` of its section ``cfg`` at ``base``; its :class:`Invalid`
    becomes the PolicyError naming ``<base>.<key>`` (the section itself for an empty key)."""
    try:
        check(cfg, policy)
    except Invalid as exc:
        where = f"{base}.{exc.key}" if exc.key else base
        raise PolicyError(policy.source, where, exc.reason) from None


def _check_ladder_order(src: str, base: str, actions: Sequence[str]) -> None:
    specs = registry.actions()
    for i, action in enumerate(actions[:-1]):
        nxt = actions[i + 1]
        spec = specs[action]
        if spec.final:
            raise PolicyError(src, f"{base}.ladder[{i + 1}]", f"{nxt!r} after {action!r}: the target is gone by then")
        if spec.then is not None and nxt not in spec.then:
            raise PolicyError(src, f"{base}.ladder[{i + 1}]",
                              f"{nxt!r} after {action!r}: only {' or '.join(spec.then)} may follow it")


def _has_destructive(policy: Policy) -> bool:
    from gpu_cost.core.model import DESTRUCTIVE_ACTIONS

    for name in registry.rules():
        rule = policy.rule(name)
        if rule.enabled and policy.rule_mode(name) == "enforce" and any(
            r.action in DESTRUCTIVE_ACTIONS for r in rule.ladder
        ):
            return True
    return False


def _check_tz(src: str, path: str, name: str) -> None:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise PolicyError(src, path, f"unknown time zone {name!r} (use an IANA name such as Europe/Berlin)") from None


def _minutes(hhmm: str) -> int:
    h, m = hhmm.strip().split(":")
    return int(h) * 60 + int(m)


def _check_window(src: str, path: str, w: Window) -> None:
    for key in ("start", "end"):
        val = getattr(w, key)
        if not _HHMM.match(val):
            raise PolicyError(src, f"{path}.{key}", f"must be HH:MM (00:00-24:00), got {val!r}")
        if _minutes(val) > 24 * 60:
            raise PolicyError(src, f"{path}.{key}", f"past 24:00: {val!r}")
    if w.start == w.end:
        raise PolicyError(src, path, f"start and end are both {w.start}: an empty window")
    if not w.days:
        raise PolicyError(src, f"{path}.days", "no days: the window never opens")
