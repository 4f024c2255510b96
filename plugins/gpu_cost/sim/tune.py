"""Tune a policy on a trace: candidate policies replayed, and the Pareto set of what they free and what they cost.

Operators rarely know their thresholds. Given a trace (the project's trace format, or the audit
store's own usage rows: :mod:`gpu_cost.report.usage_trace`), a base policy and a *search space*,
:func:`tune` replays every candidate policy as ``gpu-cost replay`` does for a what-if (enforce,
approvals approved) and compares them on four figures:

``freed_gpu_hours``        the savings ledger's freed GPU-hours (what the agent would have booked; more is better)
``false_kills``            kills of GPUs that were active within the rule window before or any time after (fewer)
``notices_per_user_week``  notices sent (every notice action carried out) per user of the trace per week (fewer)
``idle_left_gpu_hours``    GPU-hours still held idle after the simulated kills, measured with the *base*
                           policy's thresholds for every candidate, so a candidate cannot look better by
                           calling less idle (fewer)

The Pareto set holds every candidate no other candidate beats on one figure without losing on
another. The *chosen* candidate is the one that frees the most GPU-hours with no false kill and at
most the base's notices per user per week (ties: fewer notices, less idle left, fewer changes); if
that is the base itself, or nothing qualifies, none is chosen and the answer says why.
:func:`render_policy` writes it as a policy file: the base file with the tuned values edited in
place (comments kept), a header comment with the figures and a unified diff against the base.
Nothing here reads or writes the running policy.

The space is a YAML mapping of dotted policy paths (``rules.idle_allocation.ladder[1].after``
indexes a ladder rung) to a list of choices or a range ``{min, max[, steps]}`` (numbers, or
durations such as ``15m``; ``steps`` grid points, default 3)::

    rules.idle_allocation.window: [15m, 30m, 1h]
    rules.idle_allocation.util_max: {min: 2, max: 8, steps: 3}

It is checked like a policy: duplicate keys, unknown paths and values the policy loader refuses
are errors naming the space file and the key. When the grid (every combination) has at most
``max_candidates`` candidates it is searched whole; otherwise ``max_candidates`` distinct candidates
are drawn at random (``seed``). Each candidate is validated by the real policy loader; one it
refuses (two knobs that contradict each other) is listed as invalid and not replayed.

The trace is read and made dense once (:class:`gpu_cost.sim.replay.PreparedTrace`); each candidate's
replay works on copies of the matrices a simulated kill edits.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import logging
import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_cost.config.schema import Policy
from gpu_cost.core.errors import GpuCostError, PolicyError
from gpu_cost.core.timeutil import format_duration, iso, parse_duration

logger = logging.getLogger(__name__)

#: (figure, direction): what the Pareto set and the choice compare
OBJECTIVES: tuple[tuple[str, str], ...] = (
    ("freed_gpu_hours", "max"),
    ("false_kills", "min"),
    ("notices_per_user_week", "min"),
    ("idle_left_gpu_hours", "min"),
)
DEFAULT_MAX_CANDIDATES = 48
#: grid points of a range without ``steps``
DEFAULT_STEPS = 3
MAX_STEPS = 50
WEEK = 7 * 86400.0
#: a knob path: dotted keys, a key may index a list (``ladder[1]``)
PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\[\d+\])?(\.[A-Za-z_][A-Za-z0-9_-]*(\[\d+\])?)*$")
#: paths a space may not tune, and why
FIXED = {
    "version": "the policy format's version is not a knob",
    "mode": "every candidate is replayed in enforce; the written policy keeps the base's mode",
    "sweep.sample_interval": "the replay samples at the trace's own interval",
    "sweep.source": "the replay reads the trace, whatever the source",
    "sweep.keep_parked": "the replay parks no state for later tasks",
}
RANGE_KEYS = ("min", "max", "steps")

Progress = Callable[[int, int, str], None]


# -- the search space -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Knob:
    """One tuned policy path: a list of ``choices``, or a range ``low``..``high`` (``unit``: int, float, duration).

    Values are as a policy file writes them (a duration as ``30m``).
    """

    path: str
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    steps: int = DEFAULT_STEPS
    unit: str = ""

    def grid(self) -> list[Any]:
        """Return the values a grid search tries (a range: ``steps`` points from ``low`` to ``high``, distinct)."""
        if self.choices:
            return list(self.choices)
        assert self.low is not None and self.high is not None
        out: list[Any] = []
        for i in range(self.steps):
            value = self._value(self.low + (self.high - self.low) * i / (self.steps - 1))
            if value not in out:
                out.append(value)
        return out

    def draw(self, rng: random.Random) -> Any:
        """Return a value drawn at random: a choice, or a point of the range."""
        if self.choices:
            return self.choices[rng.randrange(len(self.choices))]
        assert self.low is not None and self.high is not None
        if self.unit == "int":
            return rng.randint(int(self.low), int(self.high))
        x = rng.uniform(self.low, self.high)
        if self.unit == "duration" and self.high - self.low >= 120:
            x = min(self.high, max(self.low, round(x / 60.0) * 60.0))  # whole minutes, as people write them
        return self._value(x)

    def _value(self, x: float) -> Any:
        if self.unit == "int":
            return round(x)
        if self.unit == "duration":
            return format_duration(round(x), parts=None)
        return round(float(x), 4)


@dataclass(frozen=True)
class Space:
    """A checked search space: its knobs, in the file's order."""

    source: str
    knobs: tuple[Knob, ...]

    def grid_size(self) -> int:
        return math.prod(len(k.grid()) for k in self.knobs)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "grid_size": self.grid_size(),
                "knobs": {k.path: (list(k.choices) if k.choices else
                                   {"min": k._value(k.low or 0), "max": k._value(k.high or 0), "steps": k.steps})
                          for k in self.knobs}}


def load_space(path: str | Path, base_text: str, base_source: str) -> Space:
    """Read and check the search space at ``path`` against the base policy (text and where it came from)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(source, "", "search space file not found") from None
    except OSError as exc:
        raise PolicyError(source, "", f"cannot read: {exc.strerror or exc}") from None
    return parse_space(text, source, base_text, base_source)


def parse_space(text: str, source: str, base_text: str, base_source: str = "<base>") -> Space:
    """Parse a search space; every fault is a PolicyError naming ``source`` and the key."""
    # the loader's own YAML reading: a duplicate key is an error
    from gpu_cost.config.loader import _load_yaml

    try:
        data = _load_yaml(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise PolicyError(source, where, f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict) or not data:
        raise PolicyError(source, "(top)", "a search space is a mapping of dotted policy paths to choices or ranges, "
                                           "e.g. rules.idle_allocation.window: [15m, 30m, 1h]")
    base_raw = _raw(base_text, base_source)
    knobs = []
    for key, spec in data.items():
        path = str(key)
        if not PATH.fullmatch(path):
            raise PolicyError(source, path, "not a dotted policy path (e.g. rules.idle_allocation.window, or "
                                            "rules.idle_allocation.ladder[1].after for a ladder rung)")
        if path in FIXED or path.split(".")[0] in FIXED:
            raise PolicyError(source, path, f"cannot be tuned: {FIXED.get(path) or FIXED[path.split('.')[0]]}")
        knob = _knob(path, spec, source)
        for value in knob.grid():  # every choice; a range's grid, its ends included
            try:
                parse_policy_text(_dump(with_overrides(base_raw, {path: value}, base_source)), base_source)
            except PolicyError as exc:
                where = "" if exc.path in ("", path) else f" (at {exc.path})"
                raise PolicyError(source, path, f"value {value!r}: {exc.reason}{where}") from None
        knobs.append(knob)
    return Space(source, tuple(knobs))


def _knob(path: str, spec: Any, source: str) -> Knob:
    if isinstance(spec, list):
        if not spec:
            raise PolicyError(source, path, "an empty list of choices")
        seen: list[Any] = []
        for v in spec:
            if v in seen:
                raise PolicyError(source, path, f"lists the choice {v!r} twice")
            seen.append(v)
        return Knob(path, choices=tuple(spec))
    if not isinstance(spec, dict):
        raise PolicyError(source, path, f"give a list of choices or a range {{min, max[, steps]}}, got {spec!r}")
    unknown = [str(k) for k in spec if k not in RANGE_KEYS]
    if unknown:
        raise PolicyError(source, f"{path}.{unknown[0]}", f"unknown key; allowed: {', '.join(RANGE_KEYS)}")
    for k in ("min", "max"):
        if k not in spec or spec[k] is None:
            raise PolicyError(source, f"{path}.{k}", "required key of a range is missing")
    lo, hi = spec["min"], spec["max"]
    steps = spec.get("steps", DEFAULT_STEPS)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= MAX_STEPS:
        raise PolicyError(source, f"{path}.steps", f"must be a whole number from 2 to {MAX_STEPS}, got {steps!r}")
    numbers = [isinstance(v, int | float) and not isinstance(v, bool) for v in (lo, hi)]
    if all(numbers):
        unit = "int" if all(isinstance(v, int) for v in (lo, hi)) else "float"
        low, high = float(lo), float(hi)
    elif all(isinstance(v, str) for v in (lo, hi)):
        try:
            low, high = parse_duration(lo), parse_duration(hi)
        except (TypeError, ValueError) as exc:
            raise PolicyError(source, path, f"min and max must both be numbers or both durations (15m, 2h): {exc}") \
                from None
        unit = "duration"
    else:
        raise PolicyError(source, path, f"min and max must both be numbers or both durations, got {lo!r} and {hi!r}")
    if not low < high:
        raise PolicyError(source, path, f"min {lo!r} is not below max {hi!r}")
    return Knob(path, low=low, high=high, steps=steps, unit=unit)


# -- policies as data ---------------------------------------------------------------------------------
def _raw(text: str, source: str) -> dict[str, Any]:
    """Return the base policy's YAML document as plain data (the loader's reading: a duplicate key is an error)."""
    from gpu_cost.config.loader import _load_yaml

    try:
        data = _load_yaml(text, source)
    except yaml.YAMLError as exc:
        raise PolicyError(source, "", f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolicyError(source, "(top)", f"must be a mapping of sections, got {type(data).__name__}")
    return data


def _parts(path: str) -> list[str | int]:
    out: list[str | int] = []
    for piece in path.split("."):
        name, _, index = piece.partition("[")
        out.append(name)
        if index:
            out.append(int(index.rstrip("]")))
    return out


def with_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any], source: str = "<base>") -> dict[str, Any]:
    """Return a copy of the policy document ``raw`` with each dotted path set to its value.

    A mapping the path goes through is created when the base leaves it out (its defaults apply);
    a list index must exist in the base: raise PolicyError naming the path otherwise.
    """
    out = copy.deepcopy(dict(raw))
    for path, value in overrides.items():
        node: Any = out
        parts = _parts(path)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            so_far = _dotted(parts[: i + 1])
            if isinstance(part, int):
                if not isinstance(node, list):
                    raise PolicyError(source, so_far, "is not a list in the base policy: write the list out in the "
                                                      "base to tune one of its items")
                if part >= len(node):
                    raise PolicyError(source, so_far, f"the base policy's list has {len(node)} item(s)")
                if last:
                    node[part] = copy.deepcopy(value)
                else:
                    node = node[part]
                continue
            if not isinstance(node, dict):
                raise PolicyError(source, so_far, "goes through a value that is not a mapping")
            if last:
                node[part] = copy.deepcopy(value)
            else:
                if node.get(part) is None:
                    if isinstance(parts[i + 1], int):
                        raise PolicyError(source, _dotted(parts[: i + 1]), "is not written in the base policy: write "
                                                                          "the list out in the base to tune its items")
                    node[part] = {}
                node = node[part]
    return out


def _dotted(parts: Sequence[str | int]) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
    return text


def value_at(raw: Mapping[str, Any], path: str) -> Any:
    """Return the value at a dotted path of a policy document, None where the document leaves it out."""
    node: Any = raw
    for part in _parts(path):
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return None
        elif not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _dump(raw: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(raw), sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)


def parse_policy_text(text: str, source: str) -> Policy:
    """Return the policy in ``text`` through the real loader (every check of ``gpu-cost policy check``)."""
    from gpu_cost.config.loader import parse_policy

    return parse_policy(text, source)


# -- candidates -----------------------------------------------------------------------------------------
@dataclass
class Candidate:
    """A policy tried: the base, or the base with ``overrides`` (dotted path -> value)."""

    name: str
    overrides: dict[str, Any]
    raw: dict[str, Any]
    policy: Policy | None = None
    error: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> bool:
        return self.name == "base"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "base": self.base, "overrides": dict(self.overrides)}
        if self.error:
            out["error"] = self.error
        else:
            out.update(self.figures)
        return out


def candidates(space: Space, base_text: str, base_source: str, *, max_candidates: int = DEFAULT_MAX_CANDIDATES,
               seed: int = 0) -> tuple[list[Candidate], str, list[Candidate]]:
    """Return ``(candidates, search, invalid)``: the base first, then the grid (``search`` ``grid``) when it has at
    most ``max_candidates`` combinations, else ``max_candidates`` distinct random draws (``random``, ``seed``).

    A candidate equal to the base or to an earlier one (a value the base already has) is left out;
    one the policy loader refuses is in ``invalid`` with the reason, not in ``candidates``.
    """
    if max_candidates < 1:
        raise GpuCostError(f"max_candidates must be at least 1, got {max_candidates}")
    base_raw = _raw(base_text, base_source)
    base = Candidate("base", {}, base_raw, parse_policy_text(base_text, base_source))
    kept: list[Candidate] = [base]
    invalid: list[Candidate] = []
    paths = [k.path for k in space.knobs]

    def consider(values: Sequence[Any]) -> bool:
        overrides = {p: v for p, v in zip(paths, values, strict=True) if value_at(base_raw, p) != v}
        name = f"c{len(kept) + len(invalid):02d}"
        raw = with_overrides(base_raw, overrides, base_source)
        try:
            policy = parse_policy_text(_dump(raw), f"{space.source} candidate {name}")
        except PolicyError as exc:
            invalid.append(Candidate(name, overrides, raw, error=f"{exc.path}: {exc.reason}" if exc.path else exc.reason))
            return False
        if any(policy == c.policy for c in kept):
            return False
        kept.append(Candidate(name, overrides, raw, policy))
        return True

    size = space.grid_size()
    if size <= max_candidates:
        for combo in itertools.product(*(k.grid() for k in space.knobs)):
            consider(combo)
        return kept, "grid", invalid
    rng = random.Random(seed)  # noqa: S311 - a reproducible search, not a secret
    seen: set[str] = set()
    tries = 0
    while len(kept) - 1 < max_candidates and tries < 50 * max_candidates:
        tries += 1
        drawn = [k.draw(rng) for k in space.knobs]
        key = repr(drawn)
        if key in seen:
            continue
        seen.add(key)
        consider(drawn)
    return kept, "random", invalid


# -- figures, the Pareto set, the choice -----------------------------------------------------------------
def figures(res: Any, users: int) -> dict[str, Any]:
    """Return a replay's tune figures (:data:`OBJECTIVES` and their context) from its :class:`ReplayResult`."""
    from gpu_cost.sim.replay import NOTICE_ACTIONS

    span = (res.end - res.start + res.sample_interval_s) if res.start is not None and res.end is not None else 0.0
    weeks = max(span, 1.0) / WEEK
    notices = [a for a in res.actions if a["action"] in NOTICE_ACTIONS]
    per_user = Counter(str(a.get("user") or "") for a in notices)
    return {
        "freed_gpu_hours": round(float((res.ledger or {}).get("freed_gpu_hours", 0.0)), 2),
        "false_kills": int(res.false_kills),
        "notices_per_user_week": round(len(notices) / max(users, 1) / weeks, 3),
        "idle_left_gpu_hours": round(float(res.idle_left_gpu_hours or 0.0), 2),
        "reclaimed_gpu_hours": round(float(res.reclaimed_gpu_hours), 2),
        "kills": int(res.kills),
        "notices": len(notices),
        "max_notices_user_week": round(max(per_user.values(), default=0) / weeks, 3),
        "idle_gpu_hours": round(float(res.idle_gpu_hours or 0.0), 2),
        "sweeps": int(res.sweeps),
        "seconds": round(float(res.seconds), 1),
    }


def dominates(a: Mapping[str, Any], b: Mapping[str, Any],
              objectives: Sequence[tuple[str, str]] = OBJECTIVES) -> bool:
    """Return whether ``a`` is at least as good as ``b`` on every objective and better on one."""
    better = False
    for key, way in objectives:
        x, y = float(a[key]), float(b[key])
        if way == "min":
            x, y = -x, -y
        if x < y:
            return False
        if x > y:
            better = True
    return better


def pareto(points: Sequence[Mapping[str, Any]], objectives: Sequence[tuple[str, str]] = OBJECTIVES) -> list[int]:
    """Return the indices of the points no other point dominates, in their order."""
    return [i for i, p in enumerate(points)
            if not any(dominates(q, p, objectives) for j, q in enumerate(points) if j != i)]


def choose(tried: Sequence[Candidate]) -> tuple[Candidate | None, str]:
    """Return the candidate to propose and why: the most GPU-hours freed with no false kill and at most the
    base's notices per user per week (ties: fewer notices, less idle left, fewer changes); None when that is
    the base itself, or when no candidate qualifies."""
    base = next(c for c in tried if c.base)
    limit = float(base.figures["notices_per_user_week"])
    ok = [c for c in tried if not c.error and c.figures and c.figures["false_kills"] == 0
          and float(c.figures["notices_per_user_week"]) <= limit + 1e-9]
    if not ok:
        return None, (f"no candidate qualifies: none had 0 false kills with at most the base's {limit:g} notices per "
                      "user per week")
    best = max(ok, key=lambda c: (float(c.figures["freed_gpu_hours"]), -float(c.figures["notices_per_user_week"]),
                                  -float(c.figures["idle_left_gpu_hours"]), -len(c.overrides), c.base))
    if best.base:
        return None, (f"no candidate beats the base: it frees {best.figures['freed_gpu_hours']:g} GPU-hours with "
                      f"{best.figures['false_kills']} false kills, and no candidate with 0 false kills and at most its "
                      "notices frees more")
    gain = float(best.figures["freed_gpu_hours"]) - float(base.figures["freed_gpu_hours"])
    return best, (f"{best.name} frees the most GPU-hours ({best.figures['freed_gpu_hours']:g}, {gain:+g} against the "
                  f"base) with 0 false kills and {best.figures['notices_per_user_week']:g} notices per user per week "
                  f"(base {limit:g})")


# -- the tune -----------------------------------------------------------------------------------------------
@dataclass
class TuneResult:
    """What a tune found; :meth:`to_dict` is the ``gpu-cost tune --json`` payload."""

    search: str
    seed: int
    space: Space
    base_source: str
    base_text: str
    tried: list[Candidate]
    invalid: list[Candidate]
    pareto: list[str]
    chosen: Candidate | None
    reason: str
    trace: dict[str, Any] = field(default_factory=dict)
    max_candidates: int = DEFAULT_MAX_CANDIDATES
    prepare_seconds: float = 0.0
    seconds: float = 0.0

    def by_name(self, name: str) -> Candidate:
        return next(c for c in self.tried if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        base = self.by_name("base")
        chosen = None
        if self.chosen is not None:
            chosen = {**self.chosen.to_dict(), "gain_gpu_hours": round(
                float(self.chosen.figures["freed_gpu_hours"]) - float(base.figures["freed_gpu_hours"]), 2)}
        return {
            "search": self.search, "seed": self.seed, "max_candidates": self.max_candidates,
            "space": self.space.to_dict(), "base": self.base_source,
            "replayed_as": {"mode": "enforce", "approvals": "approve"},
            "objectives": {k: way for k, way in OBJECTIVES},
            "trace": self.trace,
            "candidates": [c.to_dict() for c in self.tried],
            "invalid": [c.to_dict() for c in self.invalid],
            "pareto": list(self.pareto),
            "chosen": chosen, "reason": self.reason,
            "prepare_seconds": round(self.prepare_seconds, 1), "seconds": round(self.seconds, 1),
        }


def idle_measure(policy: Policy) -> tuple[float, float]:
    """Return the thresholds that measure idle GPU-hours for every candidate: the base's (util_max %, mem_min MiB)."""
    return float(policy.rules.idle_allocation.util_max), float(policy.rules.zombie.mem_min_mib)


#: the prepared trace the replays of a worker pool read (set before the pool forks: shared, never copied whole)
_SHARED: dict[str, Any] = {}


def _replay_one(item: tuple[int, int]) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Replay one candidate over the shared prepared trace; return ``(index, figures, trace facts)``."""
    index, users = item
    res = _SHARED["prepared"].replay(_SHARED["policies"][index], mode="enforce", approvals="approve")
    facts = {"start": iso(res.start) if res.start is not None else None,
             "end": iso(res.end) if res.end is not None else None, "gpus": res.gpus, "jobs": res.jobs,
             "users": users, "sample_interval_s": res.sample_interval_s, "notes": list(res.notes)}
    return index, figures(res, users), facts


def _replays(items: list[tuple[int, int]], workers: int) -> Iterator[tuple[int, dict[str, Any], dict[str, Any]]]:
    """Yield each candidate's replay as it ends: here, or in a pool of forked workers (the trace and the policies
    are not copied: the workers inherit them)."""
    if workers == 1:
        yield from map(_replay_one, items)
        return
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(min(workers, len(items))) as pool:
        yield from pool.imap_unordered(_replay_one, items)


def tune(prepared: Any, base_text: str, base_source: str, space: Space, *,
         max_candidates: int = DEFAULT_MAX_CANDIDATES, seed: int = 0, progress: Progress | None = None,
         prepare_seconds: float = 0.0, workers: int = 1) -> TuneResult:
    """Replay the base and every candidate of ``space`` over ``prepared`` (:class:`gpu_cost.sim.replay.PreparedTrace`).

    :param progress: called with ``(done, total, candidate name)`` before the replays and after each one.
    :param workers: replays run at once, in forked processes that share the prepared trace (1: in this process).
    """
    t0 = time.time()
    tried, search, invalid = candidates(space, base_text, base_source, max_candidates=max_candidates, seed=seed)
    if prepared.empty:
        raise GpuCostError("the trace has no GPU samples: no rule could find anything to tune on (jobs-only trace)")
    if workers < 1:
        raise GpuCostError(f"workers must be at least 1, got {workers}")
    prepared.idle_measure = idle_measure(tried[0].policy)  # type: ignore[arg-type]
    users = int(prepared.jobs["user"].replace("", None).dropna().nunique()) if "user" in prepared.jobs else 0
    logger.info("tune: %s search, %d candidate(s) and the base (%d invalid) over %d user(s), %d worker(s)", search,
                len(tried) - 1, len(invalid), users, workers)
    items = [(i, users) for i in range(len(tried))]
    trace: dict[str, Any] = {}
    if progress is not None:
        progress(0, len(tried), tried[0].name)
    _SHARED.update(prepared=prepared, policies=[c.policy for c in tried])
    try:
        for done, (i, figs, facts) in enumerate(_replays(items, workers), start=1):
            tried[i].figures = figs
            if i == 0:
                trace = facts
            logger.info("tune: %s %s: %s", tried[i].name, tried[i].overrides or "(base)", figs)
            if progress is not None:
                progress(done, len(tried), tried[i].name)
    finally:
        _SHARED.clear()
    front = pareto([c.figures for c in tried])
    chosen, reason = choose(tried)
    return TuneResult(search=search, seed=seed, space=space, base_source=base_source, base_text=base_text,
                      tried=tried, invalid=invalid, pareto=[tried[i].name for i in front], chosen=chosen,
                      reason=reason, trace=trace, max_candidates=max_candidates, prepare_seconds=prepare_seconds,
                      seconds=time.time() - t0 + prepare_seconds)


# -- the proposed policy file -----------------------------------------------------------------------------
def _scalar(value: Any) -> str:
    """Return ``value`` as YAML writes it inline (``30m``, ``5``, ``[a, b]``)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True).strip()
    return text[: -len("...")].strip() if text.endswith("\n...") else text


def _edited(base_text: str, overrides: Mapping[str, Any]) -> str | None:
    """Return the base text with each tuned value written over the base's own (comments kept); None when a path
    is not a plain value of the base file."""
    root = yaml.compose(base_text, Loader=yaml.SafeLoader)
    edits = []
    for path, value in overrides.items():
        node: Any = root
        for part in _parts(path):
            if isinstance(part, int):
                if not isinstance(node, yaml.SequenceNode) or part >= len(node.value):
                    return None
                node = node.value[part]
                continue
            if not isinstance(node, yaml.MappingNode):
                return None
            found = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
            if len(found) != 1:
                return None
            node = found[0]
        if not isinstance(node, yaml.ScalarNode):
            return None
        edits.append((node.start_mark.index, node.end_mark.index, _scalar(value)))
    out = base_text
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return out


def render_policy(result: TuneResult, candidate: Candidate, out_name: str = "proposed.yaml") -> str:
    """Return the candidate as a policy file: a header comment (figures, changes, a unified diff against the
    base) over the base file with the tuned values edited in (the whole document rewritten, comments lost,
    only when a tuned key is not a plain value of the base file). The text is checked by the policy loader."""
    body = _edited(result.base_text, candidate.overrides)
    note = ""
    if body is None or parse_policy_text(body, out_name) != candidate.policy:
        body = _dump(candidate.raw)
        note = "# (a tuned key is not written in the base file: the document is rewritten and its comments are lost)\n"
    if parse_policy_text(body, out_name) != candidate.policy:
        raise GpuCostError(f"the proposed policy {candidate.name} does not read back as the candidate replayed")
    base = result.by_name("base")
    rows = [("GPU-hours freed (ledger)", "freed_gpu_hours"), ("false kills", "false_kills"),
            ("notices per user per week", "notices_per_user_week"), ("GPU-hours left idle", "idle_left_gpu_hours"),
            ("GPU-hours reclaimed (trace)", "reclaimed_gpu_hours"), ("kills", "kills"), ("notices", "notices")]
    tr = result.trace
    head = [
        f"# Proposed by `gpu-cost tune` ({result.search} search, seed {result.seed}): candidate {candidate.name} of "
        f"{len(result.tried) - 1}, space {result.space.source}.",
        "# NOT IN USE: the running policy is unchanged. Review it, then install it the way policies are installed.",
        f"# Base: {result.base_source}. Trace: {tr.get('start')} -> {tr.get('end')}, {tr.get('gpus')} GPUs, "
        f"{tr.get('jobs')} jobs, {tr.get('users')} users; every candidate replayed in enforce, approvals approved.",
        f"# Why: {result.reason}.",
        "#",
        f"# {'figure':<30}{'base':>12}{'proposed':>12}",
        *[f"# {label:<30}{base.figures[key]!s:>12}{candidate.figures[key]!s:>12}" for label, key in rows],
        "#",
        "# Changes:",
        *[f"#   {p}: {_scalar(value_at(base.raw, p))} -> {_scalar(v)}" for p, v in candidate.overrides.items()],
        "#",
        "# Unified diff against the base:",
    ]
    diff = difflib.unified_diff(result.base_text.splitlines(), body.splitlines(), fromfile=result.base_source,
                                tofile=out_name, n=1, lineterm="")
    head += [f"# {line}".rstrip() for line in diff]
    return "\n".join(head) + "\n" + note + "\n" + body


def write_policy(result: TuneResult, out: str | Path) -> Path:
    """Write the chosen candidate to ``out`` (:func:`render_policy`); never onto the base or the running policy.

    Raises GpuCostError when none was chosen or ``out`` is the base or the running policy file.
    """
    from gpu_cost.core import paths

    if result.chosen is None:
        raise GpuCostError(f"nothing written to {out}: {result.reason}")
    target = Path(out)
    forbidden = {Path(result.base_source).resolve(), paths.default_policy().resolve()}
    if target.resolve() in forbidden:
        raise GpuCostError(f"--write {out}: that is the base or the running policy; a tune never changes it "
                           "(write elsewhere, review, then install)")
    text = render_policy(result, result.chosen, target.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    logger.info("tune: wrote %s (%s)", target, result.chosen.name)
    return target


def summary_text(payload: Mapping[str, Any]) -> str:
    """Return the human summary of a tune payload: the Pareto set as a table, and the choice."""
    cands = {c["name"]: c for c in payload["candidates"]}
    tr = payload.get("trace") or {}
    lines = [f"tune of {payload['base']} on {tr.get('gpus')} GPUs, {tr.get('start')} -> {tr.get('end')}: "
             f"{payload['search']} search" + (f" (seed {payload['seed']})" if payload["search"] == "random" else "")
             + f", {len(cands) - 1} candidate(s) and the base replayed in enforce, approvals approved; "
             f"{len(payload['invalid'])} invalid; {payload['seconds']}s"]
    lines += ["", table(payload, only_pareto=True), ""]
    chosen = payload.get("chosen")
    lines.append(f"chosen: {chosen['name']} {chosen['overrides']}" if chosen else "chosen: none")
    lines.append(f"  {payload['reason']}")
    for c in payload["invalid"][:5]:
        lines.append(f"  invalid {c['name']} {c['overrides']}: {c['error']}")
    if payload.get("written"):
        lines.append(f"written: {payload['written']} (not in use: the running policy is unchanged)")
    return "\n".join(lines)


COLUMNS = (("freed_gpu_hours", "freed GPU-h"), ("false_kills", "false kills"),
           ("notices_per_user_week", "notices/user/week"), ("idle_left_gpu_hours", "idle left GPU-h"))


def table(payload: Mapping[str, Any], *, only_pareto: bool = False, markdown: bool = False) -> str:
    """Return the candidates (the Pareto set only, with ``only_pareto``) as a text or Markdown table."""
    front = set(payload["pareto"])
    chosen = (payload.get("chosen") or {}).get("name")
    rows = [c for c in payload["candidates"] if not only_pareto or c["name"] in front or c["base"]]
    head = ["candidate", *(label for _, label in COLUMNS), "pareto", "changes"]
    body = []
    for c in rows:
        mark = "yes" if c["name"] in front else ""
        name = c["name"] + (" (chosen)" if c["name"] == chosen else "")
        changes = ", ".join(f"{p}={_scalar(v)}" for p, v in c["overrides"].items()) or "(base)"
        body.append([name, *(f"{c[k]:g}" for k, _ in COLUMNS), mark, changes])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                     for r in [head, *body])


def pareto_png(payload: Mapping[str, Any]) -> bytes:
    """Return the Pareto plot (GPU-hours freed against notices per user per week) as PNG bytes."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = [c for c in payload["candidates"] if "freed_gpu_hours" in c]
    front = set(payload["pareto"])
    chosen = (payload.get("chosen") or {}).get("name")
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=100)
    for c in cands:
        on = c["name"] in front
        color = "#ef4444" if c["false_kills"] else ("#16a34a" if on else "#9ca3af")
        ax.scatter(c["notices_per_user_week"], c["freed_gpu_hours"], s=70 if on else 30, color=color,
                   marker="*" if c["name"] == chosen else ("s" if c["base"] else "o"), zorder=3,
                   edgecolors="#1f2937" if on else "none")
        if on or c["base"]:
            ax.annotate(c["name"], (c["notices_per_user_week"], c["freed_gpu_hours"]), textcoords="offset points",
                        xytext=(5, 4), fontsize=8, color="#1f2937")
    ax.set_xlabel("notices per user per week (fewer is better)")
    ax.set_ylabel("GPU-hours freed (ledger; more is better)")
    ax.set_title(f"gpu-cost tune: {payload['search']} search, {len(cands)} policies "
                 "(green: Pareto set, red: false kills, square: base, star: chosen)", fontsize=9)
    ax.grid(True, color="#e5e7eb")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_report(result: TuneResult, folder: Any, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Write a tune's report into ``folder`` (a Path or an ObjectStoragePath): ``tune.json``, ``pareto.png``,
    ``index.html`` (the table, the plot embedded), ``summary.md`` and, when a candidate was chosen,
    ``proposed.yaml`` (:func:`render_policy`; not in use). Return the files' locations."""
    import base64
    import json

    import jinja2

    from gpu_cost.core import paths

    payload = {**result.to_dict(), **(extra or {})}
    templates = paths.include_dir() / "templates" / "tune"
    if not templates.is_dir():
        raise GpuCostError(f"tune report templates not found in {templates}")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)), autoescape=jinja2.select_autoescape(["html"]),
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuCostError(f"cannot create the tune report folder {folder}: {exc}") from exc
    out = {"folder": str(folder)}
    proposed = None
    if result.chosen is not None:
        proposed = render_policy(result, result.chosen)
        (folder / "proposed.yaml").write_text(proposed, encoding="utf-8")
        out["proposed"] = str(folder / "proposed.yaml")
    png = pareto_png(payload)
    (folder / "pareto.png").write_bytes(png)
    (folder / "tune.json").write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    index = folder / "index.html"
    index.write_text(env.get_template("index.html.j2").render(t=payload, png=base64.b64encode(png).decode("ascii"),
                                                              proposed=proposed), encoding="utf-8")
    (folder / "summary.md").write_text(env.get_template("summary.md.j2").render(
        t=payload, table=table(payload, markdown=True), link=str(index)), encoding="utf-8")
    out.update(pareto=str(folder / "pareto.png"), tune=str(folder / "tune.json"), report=str(index),
               summary=str(folder / "summary.md"))
    logger.info("tune report written to %s", index)
    return out


__all__ = ["OBJECTIVES", "Candidate", "Knob", "Space", "TuneResult", "candidates", "choose", "dominates", "figures",
           "load_space", "pareto", "pareto_png", "parse_space", "render_policy", "summary_text", "table", "tune",
           "with_overrides", "write_policy", "write_report"]
