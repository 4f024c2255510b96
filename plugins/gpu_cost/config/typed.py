"""Build frozen dataclasses from plain YAML data, with errors that name the path.

A tiny, strict cousin of pydantic: unknown keys, wrong types and out-of-range values raise
:class:`~gpu_cost.core.errors.PolicyError` with the file, the dotted path and the reason. Types
understood: ``bool``, ``int``, ``float``, ``str``, ``Literal``, ``X | None``, ``tuple[T, ...]``,
``dict[str, T]``, nested dataclasses, and ``Annotated`` markers :class:`Dur` (durations such as
``15m``), :class:`Range` (bounds), :class:`Regex` (a pattern that must compile) and :class:`OneOf` (text from a set known only at run time,
such as the registered actions). A class with a ``from_policy(value, source, path)`` classmethod builds
itself: the ``rules:`` section (:class:`gpu_cost.config.schema.Rules`), whose keys are the registered rules.
A field whose metadata sets :data:`SPREAD` is no key of its own: it takes the keys of its parent that its
type's ``configs()`` names (the actions' top-level sections, :class:`gpu_cost.config.schema.Actions`), built
by its ``from_policy`` at the parent's path. What types cannot say a section's own check says by raising
:class:`Invalid`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from gpu_cost.core.errors import PolicyError
from gpu_cost.core.timeutil import parse_duration

T = TypeVar("T")

#: a dataclass field's metadata key: the field takes its parent's keys that its type's ``configs()`` names
SPREAD = "spread"


@dataclass(frozen=True)
class Dur:
    """Marks a float field read as a duration (``90``, ``"15m"``, ``"1h30m"``) in seconds."""


@dataclass(frozen=True)
class Range:
    """Bounds for a number (inclusive)."""

    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True)
class Regex:
    """Marks a ``str`` field read as a regular expression (Python syntax); a bad one is an error that names it."""


class Invalid(ValueError):
    """A setting refused by a section's own check: ``key`` is its path inside the section
    (``act_on_owners[0]``); ``""`` refuses the section as a whole."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}" if key else reason)
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class OneOf:
    """Marks a ``str`` field whose allowed values ``values()`` returns when the policy is read."""

    values: Callable[[], Iterable[str]]


def build(cls: type[T], data: Any, source: str, path: str = "") -> T:
    """Return an instance of dataclass ``cls`` built from ``data``; raise PolicyError on any fault."""
    return typing.cast(T, _convert(cls, data, source, path, ()))


def _convert(tp: Any, value: Any, source: str, path: str, marks: tuple[Any, ...]) -> Any:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extra = get_args(tp)
        return _convert(base, value, source, path, tuple(extra))
    hook = getattr(tp, "from_policy", None) if isinstance(tp, type) else None
    if callable(hook):  # a section that builds itself (``rules:``: its keys are the registered rules)
        return hook(value, source, path)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, value, source, path)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:  # ``X | None``: X's own error, which names the key inside it
            return _convert(non_none[0], value, source, path, marks)
        errors = []
        for a in non_none:
            try:
                return _convert(a, value, source, path, marks)
            except PolicyError as exc:
                errors.append(exc.reason)
        raise PolicyError(source, path, " or ".join(errors))
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise PolicyError(source, path, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value
    if origin is tuple:
        args = get_args(tp)
        if value is None:
            return ()
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            raise PolicyError(source, path, f"must be a list, got {type(value).__name__} {_short(value)}")
        item = args[0]
        return tuple(_convert(item, v, source, f"{path}[{i}]", marks) for i, v in enumerate(value))
    if origin is dict:
        key_t, val_t = get_args(tp)
        if value is None:
            return types.MappingProxyType({})
        if not isinstance(value, Mapping):
            raise PolicyError(source, path, f"must be a mapping, got {type(value).__name__} {_short(value)}")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                k = str(k)
            if get_origin(key_t) is Literal:
                _convert(key_t, k, source, _join(path, k), ())
            out[k] = _convert(val_t, v, source, _join(path, k), marks)
        return types.MappingProxyType(out)
    if tp is Any:
        return value
    if tp is float and any(isinstance(m, Dur) for m in marks):
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise PolicyError(source, path, str(exc)) from None
        return _bounded(seconds, marks, source, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise PolicyError(source, path, f"must be true or false, got {_short(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError(source, path, f"must be an integer, got {_short(value)}")
        return _bounded(value, marks, source, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PolicyError(source, path, f"must be a number, got {_short(value)}")
        if value != value or value in (float("inf"), float("-inf")):
            raise PolicyError(source, path, f"must be a finite number, got {value!r}")
        return _bounded(float(value), marks, source, path)
    if tp is str:
        if isinstance(value, dt.date | dt.time):
            value = value.isoformat()
        if not isinstance(value, str):
            raise PolicyError(source, path, f"must be text, got {type(value).__name__} {_short(value)}")
        for m in marks:
            if isinstance(m, OneOf) and value not in (allowed := tuple(m.values())):
                raise PolicyError(source, path, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")
            if isinstance(m, Regex):
                import re

                try:
                    re.compile(value)
                except re.error as exc:
                    raise PolicyError(source, path, f"is not a valid regular expression ({exc}): {value!r}") from None
        return value
    raise PolicyError(source, path, f"internal: unsupported type {tp!r}")


def _dataclass(cls: type, value: Any, source: str, path: str) -> Any:
    value = mapping(value, source, path)
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get(SPREAD)}
    aliases = {name.replace("_", "-"): name for name in fields}
    spread: dict[str, str] = {}  # a key another field takes → that field
    for f in dataclasses.fields(cls):
        if f.init and f.metadata.get(SPREAD):
            for key in hints[f.name].configs():
                if key in fields:
                    raise PolicyError(source, _join(path, key), f"is a section of its own and also declared by "
                                                                f"a registered module ({f.name}): rename that one")
                spread[key] = spread[key.replace("_", "-")] = f.name
    kwargs: dict[str, Any] = {}
    taken: dict[str, dict[str, Any]] = {}
    for key, raw in value.items():
        name = aliases.get(str(key), str(key))
        if name not in fields:
            if str(key) not in spread:
                raise unknown_key(source, path, str(key), [*fields, *(k for k in spread if "-" not in k)])
            taken.setdefault(spread[str(key)], {})[str(key)] = raw
            continue
        kwargs[name] = _convert(hints[name], raw, source, _join(path, str(key)), ())
    for name, raw_sections in taken.items():
        kwargs[name] = hints[name].from_policy(raw_sections, source, path)
    for name, f in fields.items():
        if name in kwargs:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PolicyError(source, _join(path, name), "required key is missing")
    try:
        return cls(**kwargs)
    except PolicyError:
        raise
    except (TypeError, ValueError) as exc:
        raise PolicyError(source, path or "(top)", str(exc)) from None


def _bounded(value: Any, marks: tuple[Any, ...], source: str, path: str) -> Any:
    for m in marks:
        if isinstance(m, Range):
            if m.lo is not None and value < m.lo:
                raise PolicyError(source, path, f"must be ≥ {m.lo:g}, got {value!r}")
            if m.hi is not None and value > m.hi:
                raise PolicyError(source, path, f"must be ≤ {m.hi:g}, got {value!r}")
    return value


def mapping(value: Any, source: str, path: str) -> Mapping[Any, Any]:
    """Return ``value`` (None: empty) as a section's mapping, or raise PolicyError naming ``path``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PolicyError(source, path or "(top)", f"must be a mapping, got {type(value).__name__} {_short(value)}")
    return value


def unknown_key(source: str, path: str, key: str, allowed: Iterable[str]) -> PolicyError:
    """Return the error for ``key``, not one of ``allowed``, in the section at ``path``."""
    names = sorted(allowed)
    near = _nearest(key, names)
    hint = f" (did you mean {near!r}?)" if near else ""
    return PolicyError(source, _join(path, key), f"unknown key{hint}; allowed: {', '.join(names)}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _nearest(key: str, names: list[str]) -> str | None:
    import difflib

    hits = difflib.get_close_matches(key.replace("-", "_"), names, n=1, cutoff=0.6)
    return hits[0] if hits else None
