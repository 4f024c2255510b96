"""Slurm as a source: running and pending jobs, nodes, finished jobs — from Slurm's own JSON.

Commands (argument lists, run locally or on a login node over SSH through a
:class:`~gpu_cost.perceive.runner.Runner`):

- ``squeue --json``                       running and pending jobs
- ``scontrol show nodes --json`` (23.02+), else ``sinfo --json`` (22.05)   nodes
- ``sacct --json -X -a -S <since> -E <until>``   finished jobs (accounting)
- ``scontrol show reservation --oneliner``  reservations (``Key=Value`` text, times as epoch
  seconds through ``SLURM_TIME_FORMAT=%s``: there is no JSON for it before 23.02)

The JSON changed across Slurm versions. Every shape from 22.05 to 25.11 is read (tested on each
version's answers in ``tests/data/slurm/``):

- **22.05** (OpenAPI ``v0.0.38``): plain numbers (``"time_limit": 60``, ``null`` when unset),
  ``"job_state": "RUNNING"``, node ``"state": "idle"`` plus ``"state_flags"``.
- **23.02** (data_parser ``v0.0.39``): ``UINT32_NO_VAL`` numbers wrapped as
  ``{"set": true, "infinite": false, "number": 60}``, times still plain, ``job_state`` text.
- **23.11 - 25.11** (``v0.0.40`` - ``v0.0.44``): times wrapped too, ``"job_state": ["RUNNING"]``,
  node ``"state": ["IDLE", "POWERED_DOWN"]``, sacct ``"state": {"current": ["COMPLETED"]}``;
  ``job_resources.nodes.allocation[]`` from v0.0.41; the job's SLUID in ``step_id`` from v0.0.44.

Job ids are opaque text (:data:`JOB_ID`: numbers, array tasks, SLUIDs) and checked by
:func:`check_job_id` before they become a command argument. The same parsers read slurmrestd's
answers (:mod:`gpu_cost.perceive.slurmrestd`; its :func:`~gpu_cost.perceive.slurmrestd.default_source` picks it when configured).

GPU indices of a running job come from ``gres_detail`` (``gpu:a100:2(IDX:0-1)``, one entry per
allocated node, in node-list order). A malformed or truncated answer raises
:class:`~gpu_cost.core.errors.SourceError` naming the command and what is wrong.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import Job, Node, Reservation, labels_from_comment
from gpu_cost.core.timeutil import epoch
from gpu_cost.perceive.runner import LocalRunner, Runner, SSHRunner

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Airflow SSH connection of the login node, when Slurm commands run remotely
SSH_CONN_ID = "gpu_cost_slurm_ssh"
TERMINAL_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
    "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT",
})

# ``sinfo``'s one-character suffixes for node state flags
_NODE_FLAG_SUFFIX = (
    ("NOT_RESPONDING", "*"), ("POWERED_DOWN", "~"), ("POWERING_UP", "#"), ("POWERING_DOWN", "%"),
    ("POWER_DOWN", "!"), ("REBOOT_REQUESTED", "@"), ("MAINTENANCE", "$"), ("PLANNED", "-"),
)
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]*)?(?::(\d+))?\(IDX:([^)]*)\)")
_GPU_TYPE = re.compile(r"(?:^|,)gpu(?::([A-Za-z][^:(,]*))?(?::(\d+))?")


# -- small parsers (pure, unit-tested) ---------------------------------------------------------
def expand_hostlist(text: str | None) -> list[str]:
    """Expand a Slurm hostlist: ``gpu[01-02,05],login1`` → ``[gpu01, gpu02, gpu05, login1]``.

    Zero padding is kept (``[08-10]`` → ``08, 09, 10``); nested brackets such as
    ``rack[1-2]-n[1-2]`` expand as a product. Raises ValueError on unbalanced brackets.
    """
    if text is None:
        return []
    text = text.strip()
    if not text or text in ("(null)", "None assigned", "N/A"):
        return []
    out: list[str] = []
    for part in split_top_level(text):
        out.extend(_expand_one(part))
    return out


def split_top_level(text: str) -> list[str]:
    """Split a Slurm list at its commas outside brackets (``gpu[01,03],login1:0`` → ``gpu[01,03]``, ``login1:0``).
    Raises ValueError on unbalanced brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(part: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", part)
    if not m:
        return [part]
    head, body, tail = part[: m.start()], m.group(1), part[m.end():]
    out = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty range in hostlist {part!r}")
        if "-" in item:
            lo, _, hi = item.partition("-")
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {item!r} in hostlist {part!r}")
            width = len(lo)
            values = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
        else:
            if not item.isdigit():
                raise ValueError(f"bad number {item!r} in hostlist {part!r}")
            values = [item]
        for v in values:
            out.extend(_expand_one(head + v + tail))
    return out


def compress_hostlist(names: Iterable[str]) -> str:
    """Return a compact hostlist (``gpu[01-03,05]``) for names sharing a prefix; others comma-joined."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for n in sorted(set(names)):
        m = re.fullmatch(r"(.*?)(\d+)", n)
        if m:
            groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
        else:
            plain.append(n)
    parts = list(plain)
    for (prefix, width), nums in groups.items():
        nums.sort()
        if len(nums) == 1:
            parts.append(f"{prefix}{str(nums[0]).zfill(width)}")
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for num in [*nums[1:], -1]:
            if num == prev + 1:
                prev = num
                continue
            ranges.append(str(start).zfill(width) if start == prev else f"{str(start).zfill(width)}-{str(prev).zfill(width)}")
            start = prev = num
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def parse_index_list(text: str) -> tuple[int, ...]:
    """Return GPU indices from ``0-1,3`` (``N/A`` or empty → none). Raises ValueError."""
    text = text.strip()
    if not text or text.upper() == "N/A":
        return ()
    out: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if "-" in item:
            lo, _, hi = item.partition("-")
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad index range {item!r}")
            out.extend(range(a, b + 1))
        else:
            out.append(int(item))
    return tuple(sorted(set(out)))


def gpu_indices(gres: str) -> tuple[int, ...]:
    """Return the GPU indices of one ``gres_detail`` / ``gres_used`` entry.

    ``gpu:a100:2(IDX:0-1)`` → ``(0, 1)``; ``gpu:a100:3(IDX:0-1,4),mps:0`` → ``(0, 1, 4)``;
    several GPU types on a node are merged. Raises ValueError on an unreadable IDX list.
    """
    out: list[int] = []
    for m in _GPU_IDX.finditer(gres):
        out.extend(parse_index_list(m.group(2)))
    return tuple(sorted(set(out)))


def gpu_count_and_model(gres: str) -> tuple[int, str]:
    """Return (GPU count, model) of a node's ``gres`` string: ``gpu:a100:4(S:0)`` → ``(4, "a100")``."""
    total, model = 0, ""
    for m in _GPU_TYPE.finditer(gres):
        if m.group(2):
            total += int(m.group(2))
            model = model or (m.group(1) or "")
        elif m.group(1) and m.group(1).isdigit():
            total += int(m.group(1))
    return total, model


def _tres_gpus(tres: str) -> int:
    """Return the GPU count in a TRES string: ``cpu=1,gres/gpu=2`` → 2 (typed entries not double counted)."""
    plain = typed = 0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit():
            plain += int(value)
        elif key.startswith("gres/gpu:") and value.isdigit():
            typed += int(value)
    return plain or typed


def gpus_of_text(text: str) -> int | None:
    """Return the GPUs a job asked for or holds, as accounting writes them: a TRES list (``cpu=8,gres/gpu=4``),
    a GRES (``gpu:a100:4``, ``gres:gpu:4``) or a bare count; None when the text is none of these."""
    t = text.strip()
    if t.isdigit():
        return int(t)
    if "=" in t:  # a TRES list; one without GPUs is a job without them
        return _tres_gpus(t)
    t = t.removeprefix("gres:")
    if re.fullmatch(r"gpu(?::[A-Za-z][^:,(]*)?", t):
        return 1  # --gres=gpu[:type]: one
    count, _ = gpu_count_and_model(t)
    return count if count else None


#: what accounting writes for a job without a time limit
_NO_LIMIT = frozenset({"unlimited", "infinite", "partition_limit", "not_set", "none", "n/a", ""})


def time_limit_of_text(text: str) -> float | None:
    """Return a time limit in seconds from Slurm's forms (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, ``D-HH``,
    ``D-HH:MM``); None for ``UNLIMITED``, ``Partition_Limit`` and the like. Raises ValueError otherwise."""
    t = text.strip()
    if t.lower() in _NO_LIMIT:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
    if not m or (m.group(1) is None and m.group(3) is None):
        raise ValueError(f"not a Slurm time limit: {text!r}")
    days = int(m.group(1) or 0)
    fields = [int(g) for g in m.groups()[1:] if g is not None]
    if m.group(1) is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, sec = (*fields, 0, 0)[:3]
    else:  # MM:SS, HH:MM:SS
        h, mi, sec = (0, *fields) if len(fields) == 2 else fields
    return float(((days * 24 + h) * 60 + mi) * 60 + sec)


# -- number/state helpers for both shapes ------------------------------------------------------
class _Bad(Exception):
    """Internal: a field has the wrong shape (turned into SourceError with context)."""


def _num(value: Any, field: str) -> float | None:
    """Read a number in either shape; ``None`` when unset, infinite or absent."""
    if value is None or isinstance(value, bool):
        if isinstance(value, bool):
            raise _Bad(f"{field} is a boolean, expected a number")
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping):
        if "number" not in value and "set" not in value:
            raise _Bad(f"{field} is an object without 'number'")
        if not value.get("set", True) or value.get("infinite", False):
            return None
        n = value.get("number")
        if n is None:
            return None
        if isinstance(n, bool) or not isinstance(n, int | float):
            raise _Bad(f"{field}.number is {type(n).__name__}, expected a number")
        return float(n)
    if isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
        return float(value)
    raise _Bad(f"{field} is {type(value).__name__} {value!r:.40}, expected a number")


def _ts(value: Any, field: str) -> float | None:
    n = _num(value, field)
    return n if n and n > 0 else None


def _str(d: Mapping[str, Any], key: str, default: str = "") -> str:
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, str):
        return v
    if isinstance(v, int | float) and not isinstance(v, bool):
        return str(v)
    raise _Bad(f"{key} is {type(v).__name__}, expected text")


def _state(value: Any, field: str) -> tuple[str, tuple[str, ...]]:
    """Return (base state, flags) from ``"RUNNING"`` or ``["RUNNING", "COMPLETING"]``."""
    if isinstance(value, str):
        parts = [p for p in re.split(r"[+,]", value.upper()) if p]
    elif isinstance(value, list) and all(isinstance(x, str) for x in value):
        parts = [x.upper() for x in value]
    else:
        raise _Bad(f"{field} is {type(value).__name__}, expected text or a list of text")
    if not parts:
        raise _Bad(f"{field} is empty")
    return parts[0], tuple(parts[1:])


#: a job id as Slurm's commands accept it: ``123``, an array task ``123_4``, an array's pending
#: tasks ``123_[5-9]``, a heterogeneous component ``123+1``, or a SLUID (Slurm 25.11+: ``s`` and 13
#: Crockford base32 digits, lower case). Anything else never reaches a command line.
JOB_ID = re.compile(r"[0-9]{1,10}(?:_(?:[0-9]{1,10}|\[[0-9,%-]{1,200}\]))?(?:\+[0-9]{1,5})?"
                    r"|s[0-9a-hjkmnp-tv-z]{13}")


def check_job_id(value: object, where: str = "job id") -> str:
    """Return ``value`` as a job id string when it is one Slurm accepts (see :data:`JOB_ID`).

    Job ids are opaque text to the agent (never ``int()``-ed): a SLUID is not a number. Raises
    :class:`SourceError` naming ``where`` and the value, so nothing malformed (an option such as
    ``--user=bob``, spaces, shell characters) becomes a command argument.
    """
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else None
    if text is None or not JOB_ID.fullmatch(text):
        raise SourceError(f"{where}: {str(value)!r:.60} is not a Slurm job id (digits, 123_4, 123+1 or a SLUID)")
    return text


def _sluid(d: Mapping[str, Any]) -> str:
    """The job's SLUID (``sluid`` of 26.05+, ``step_id.sluid`` of 25.11), or ``""``."""
    for holder in (d, d.get("step_id")):
        v = holder.get("sluid") if isinstance(holder, Mapping) else None
        if isinstance(v, str) and v:
            return v
    return ""


def _job_id(d: Mapping[str, Any]) -> str:
    raw = d.get("job_id")
    if isinstance(raw, str) and not re.fullmatch(r"\d+", raw.strip()):
        # an answer naming the job by an opaque id only: keep it as text, if it is a job id at all
        try:
            return check_job_id(raw, "job_id")
        except SourceError as exc:
            raise _Bad(str(exc)) from None
    jid = None if raw is None or isinstance(raw, bool) else _num(raw, "job_id")
    if not jid:
        sluid = _sluid(d)
        if sluid:
            try:
                return check_job_id(sluid, "sluid")
            except SourceError as exc:
                raise _Bad(str(exc)) from None
        raise _Bad("job_id is missing" if raw is None or isinstance(raw, bool) else "job_id is unset")
    array_job = d.get("array_job_id")
    task = d.get("array_task_id")
    if isinstance(d.get("array"), Mapping):  # sacct shape
        array_job = d["array"].get("job_id")
        task = d["array"].get("task_id")
    a = _num(array_job, "array_job_id") if array_job is not None else None
    t = _num(task, "array_task_id") if task is not None else None
    if a and t is not None:
        return f"{int(a)}_{int(t)}"
    tasks = str(d.get("array_task_string") or "").split("%", 1)[0].strip()
    if a and tasks:
        # the pending tasks of an array, listed as one record: never the bare array id, which names
        # every task (``scancel 500`` would end the running ones too)
        return f"{int(a)}_[{tasks}]"
    return str(int(jid))


# -- document parsers --------------------------------------------------------------------------
def load_json(text: str, command: str) -> dict[str, Any]:
    """Parse a command's JSON answer; raise SourceError naming the command when it is not usable."""
    if not text.strip():
        raise SourceError(f"`{command}` printed nothing (expected JSON)")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"`{command}` printed invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                          f"truncated output?") from None
    if not isinstance(doc, dict):
        raise SourceError(f"`{command}` printed a JSON {type(doc).__name__}, expected an object")
    errors = doc.get("errors") or []
    if errors:
        first = errors[0]
        msg = first.get("description") or first.get("error") if isinstance(first, Mapping) else str(first)
        raise SourceError(f"`{command}` reported an error: {msg}")
    return doc


def openapi_version(doc: Mapping[str, Any]) -> str:
    """Return the answer's OpenAPI/data_parser version (``v0.0.38``, ``v0.0.41``...), or ``""``."""
    plugin = (doc.get("meta") or {}).get("plugin") or {}
    text = f"{plugin.get('data_parser', '')} {plugin.get('type', '')}"
    m = re.search(r"v0\.0\.\d+", text)
    return m.group(0) if m else ""


def _items(doc: Mapping[str, Any], key: str, command: str) -> list[Mapping[str, Any]]:
    items = doc.get(key)
    if items is None:
        raise SourceError(f"`{command}`: the answer has no {key!r} list (keys: {sorted(doc)[:8]})")
    if not isinstance(items, list):
        raise SourceError(f"`{command}`: {key!r} is a {type(items).__name__}, expected a list")
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise SourceError(f"`{command}`: {key}[{i}] is a {type(item).__name__}, expected an object")
    return items


def _parse_each(doc: Mapping[str, Any], key: str, command: str, build: Callable[[Mapping[str, Any]], T],
                ident: str) -> list[T]:
    """Build every entry of ``doc[key]``; the first bad one raises SourceError naming its index and ``ident``."""
    out = []
    for i, d in enumerate(_items(doc, key, command)):
        try:
            out.append(build(d))
        except (_Bad, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SourceError(f"`{command}`: {key}[{i}] ({ident} {d.get(ident)!r:.30}): {exc}") from None
    return out


def parse_jobs(doc: Mapping[str, Any], command: str = "squeue --json") -> list[Job]:
    """Return the jobs of a ``squeue --json`` answer (either shape)."""
    return _parse_each(doc, "jobs", command, _job_from_squeue, "job_id")


def _job_from_squeue(d: Mapping[str, Any]) -> Job:
    state, _flags = _state(d.get("job_state"), "job_state")
    nodes = tuple(expand_hostlist(_str(d, "nodes")))
    alloc: list[tuple[str, tuple[int, ...]]] = []
    detail = d.get("gres_detail") or []
    if not isinstance(detail, list):
        raise _Bad("gres_detail is not a list")
    if detail and state not in ("PENDING",):
        alloc_nodes = _allocated_nodes(d) or list(nodes)
        for host, gres in zip(alloc_nodes, detail, strict=False):
            if not isinstance(gres, str):
                raise _Bad("gres_detail holds a non-text entry")
            idx = gpu_indices(gres)
            if idx:
                alloc.append((host, idx))
    limit = _num(d.get("time_limit"), "time_limit")
    comment = _str(d, "comment")
    running = state not in ("PENDING",) and state not in TERMINAL_STATES
    nice = _num(d.get("nice"), "nice")
    prio = _num(d.get("priority"), "priority")
    return Job(
        job_id=_job_id(d), user=_str(d, "user_name"), state=state,
        start_ts=_ts(d.get("start_time"), "start_time") if state != "PENDING" else None,
        account=_str(d, "account"), partition=_str(d, "partition"), qos=_str(d, "qos"), name=_str(d, "name"),
        comment=comment, submit_ts=_ts(d.get("submit_time"), "submit_time"),
        end_ts=_ts(d.get("end_time"), "end_time") if state in TERMINAL_STATES else None,
        time_limit_s=limit * 60.0 if limit is not None else None,
        nodes=nodes if running or state in TERMINAL_STATES else (), gpu_alloc=tuple(alloc),
        gpus_requested=_requested_gpus(d), labels=labels_from_comment(comment),
        priority=int(prio) if prio is not None else None, nice=int(nice) if nice is not None else None,
        batch=_flag(d.get("batch_flag")),
        reservation=_str(d, "resv_name"),
    )


def _flag(value: Any) -> bool | None:
    """A boolean field (``batch_flag``): true/false or 0/1; ``None`` when absent or of another shape
    (a hint, not worth failing the whole answer for)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return None


def _allocated_nodes(d: Mapping[str, Any]) -> list[str]:
    res = d.get("job_resources")
    if not isinstance(res, Mapping):
        return []
    nodes = res.get("nodes")
    if isinstance(nodes, Mapping):  # v0.0.41+: {"list": ..., "allocation": [{"name": ...}]}
        alloc = nodes.get("allocation") or []
        names = [str(a["name"]) for a in alloc if isinstance(a, Mapping) and a.get("name")]
        listed = nodes.get("list")
        return names or expand_hostlist(listed if isinstance(listed, str) else "")
    alloc = res.get("allocated_nodes") or []
    if isinstance(alloc, list):
        raw = [a.get("nodename") or a.get("name") for a in alloc if isinstance(a, Mapping)]
        if raw and all(isinstance(x, str) and x for x in raw):
            return [str(x) for x in raw]
    return expand_hostlist(nodes) if isinstance(nodes, str) else []


def _requested_gpus(d: Mapping[str, Any]) -> int:
    for key in ("tres_alloc_str", "tres_req_str"):
        v = d.get(key)
        if isinstance(v, str) and "gres/gpu" in v:
            return _tres_gpus(v)
    for key in ("tres_per_node", "tres_per_job"):
        v = d.get(key)
        if isinstance(v, str) and "gpu" in v:
            m = re.search(r"gpu(?::[A-Za-z][^:,]*)?[:=](\d+)", v)
            if m:
                nodes = _num(d.get("node_count"), "node_count") or 1
                return int(m.group(1)) * (int(nodes) if key == "tres_per_node" else 1)
    return 0


def parse_sacct(doc: Mapping[str, Any], command: str = "sacct --json") -> list[Job]:
    """Return the jobs of a ``sacct --json -X`` answer (either shape)."""
    return _parse_each(doc, "jobs", command, _job_from_sacct, "job_id")


def _job_from_sacct(d: Mapping[str, Any]) -> Job:
    st = d.get("state")
    if not isinstance(st, Mapping):
        raise _Bad("state is not an object")
    state, _ = _state(st.get("current"), "state.current")
    t = d.get("time")
    if not isinstance(t, Mapping):
        raise _Bad("time is not an object")
    comment_obj = d.get("comment")
    if isinstance(comment_obj, Mapping):
        comment = comment_obj.get("job") or ""
    else:
        comment = comment_obj or ""
    if not isinstance(comment, str):
        raise _Bad("comment.job is not text")
    gpus = 0
    tres = d.get("tres")
    if isinstance(tres, Mapping):
        for key in ("allocated", "requested"):
            for item in tres.get(key) or []:
                if isinstance(item, Mapping) and item.get("type") == "gres" and item.get("name") == "gpu":
                    gpus = int(_num(item.get("count"), f"tres.{key}.count") or 0)
            if gpus:
                break
    user = d.get("user")
    if isinstance(user, Mapping):  # some versions nest it
        user = user.get("name")
    limit = _num(t.get("limit"), "time.limit")
    nodes = tuple(expand_hostlist(_str(d, "nodes")))
    return Job(
        job_id=_job_id(d), user=user or (d.get("association") or {}).get("user") or "", state=state,
        start_ts=_ts(t.get("start"), "time.start"), account=_str(d, "account"), partition=_str(d, "partition"),
        qos=_str(d, "qos"), name=_str(d, "name"), comment=comment, submit_ts=_ts(t.get("submission"), "time.submission"),
        end_ts=_ts(t.get("end"), "time.end"), time_limit_s=limit * 60.0 if limit is not None else None,
        nodes=nodes, gpus_requested=gpus, labels=labels_from_comment(comment),
    )


def parse_nodes(doc: Mapping[str, Any], command: str = "sinfo --json") -> list[Node]:
    """Return the nodes of a ``sinfo --json`` (22.05) or ``scontrol show nodes --json`` answer."""
    items = doc.get("nodes")
    if items is None and isinstance(doc.get("sinfo"), list):  # sinfo --json of 23.x+: node groups
        seen: dict[str, Mapping[str, Any]] = {}
        try:
            for group in doc["sinfo"]:
                listed = (group.get("nodes") or {}).get("nodes")
                # a HOSTLIST: one name per entry (each entry is also read as a hostlist expression)
                names = [n for entry in (listed if isinstance(listed, list) else [listed or ""])
                         for n in expand_hostlist(str(entry))]
                for name in names:
                    seen.setdefault(name, {"name": name, "state": (group.get("node") or {}).get("state", ["UNKNOWN"]),
                                           "gres": (group.get("gres") or {}).get("total", ""),
                                           "gres_used": (group.get("gres") or {}).get("used", ""),
                                           "partitions": [(group.get("partition") or {}).get("name", "")]})
        except (AttributeError, TypeError, ValueError, IndexError) as exc:
            raise SourceError(f"`{command}`: a node group of 'sinfo' is malformed: {exc}") from None
        items = list(seen.values())
        doc = {"nodes": items}
    return _parse_each(doc, "nodes", command, _node, "name")


def _node(d: Mapping[str, Any]) -> Node:
    name = _str(d, "name")
    if not name:
        raise _Bad("name is missing")
    base, flags = _state(d.get("state"), "state")
    extra = d.get("state_flags") or []
    if not isinstance(extra, list):
        raise _Bad("state_flags is not a list")
    flags = tuple(dict.fromkeys([*flags, *(str(f).upper() for f in extra)]))
    total, model = gpu_count_and_model(_str(d, "gres"))
    used = len(gpu_indices(_str(d, "gres_used")))
    if not used:
        used = _tres_gpus(_str(d, "tres_used"))
    parts = d.get("partitions") or []
    if isinstance(parts, str):
        parts = [p for p in parts.split(",") if p]
    return Node(name=name, state=node_state_text(base, flags), gpus_total=total, gpus_alloc=used, gpu_model=model,
                partitions=tuple(str(p) for p in parts), reason=_str(d, "reason"))


def node_state_text(base: str, flags: Sequence[str]) -> str:
    """Return the compact, lower-case state sinfo prints: ``idle~`` (powered down), ``mixed#``, ``drained``."""
    base = base.lower()
    if "DRAIN" in flags:
        base = "drained" if base == "idle" else "draining"
    for flag, suffix in _NODE_FLAG_SUFFIX:
        if flag in flags:
            return base + suffix
    return base


def powered_down(node: Node) -> bool:
    """True when Slurm shows the node powered down or powering down (``~``, ``%``, ``!``)."""
    return node.state.endswith(("~", "%", "!"))


# -- reservations -------------------------------------------------------------------------------
_KEY = re.compile(r"\s+(?=[A-Za-z][A-Za-z0-9_]*=)")
_NULL = ("", "(null)", "n/a")
#: ``scontrol show reservation`` with times as epoch seconds (strftime's ``%s``), whatever the locale
RESERVATION_ARGV = ("env", "SLURM_TIME_FORMAT=%s", "scontrol", "show", "reservation", "--oneliner")


def key_values(line: str) -> dict[str, str]:
    """Return the ``Key=Value`` pairs of one ``scontrol show ... --oneliner`` line (a value may hold ``=``)."""
    out: dict[str, str] = {}
    for token in _KEY.split(line.strip()):
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def _resv_time(value: str, field: str) -> float:
    import datetime as dt

    text = value.strip()
    if re.fullmatch(r"\d{9,11}", text):
        return float(text)
    try:
        return dt.datetime.fromisoformat(text).timestamp()  # local time, as Slurm prints it by default
    except ValueError:
        raise _Bad(f"{field} is {text!r:.40}, expected epoch seconds or YYYY-MM-DDTHH:MM:SS") from None


def _names(value: str) -> tuple[str, ...]:
    # ``Users=-bob`` excludes bob: the reservation is not *for* the names after a minus sign
    return tuple(v for v in value.split(",") if v and v not in _NULL and not v.startswith("-"))


def parse_reservations(text: str, command: str = "scontrol show reservation") -> list[Reservation]:
    """Return the reservations of a ``scontrol show reservation --oneliner`` answer.

    ``No reservations in the system`` is an empty list; a line without a name or with a bad time
    raises :class:`SourceError` naming the line.
    """
    out: list[Reservation] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.strip().lower().startswith("no reservations"):
            continue
        kv = key_values(line)
        name = kv.get("ReservationName", "")
        try:
            if not name:
                raise _Bad("ReservationName is missing")
            nodes = tuple(expand_hostlist(kv.get("Nodes", ""))) if kv.get("Nodes", "") not in _NULL else ()
            count = kv.get("NodeCnt", "")
            out.append(Reservation(
                name=name, start_ts=_resv_time(kv.get("StartTime", ""), "StartTime"),
                end_ts=_resv_time(kv.get("EndTime", ""), "EndTime"), nodes=nodes,
                node_count=int(count) if count.isdigit() else len(nodes), state=kv.get("State", "").upper(),
                accounts=_names(kv.get("Accounts", "")), users=_names(kv.get("Users", "")),
                partition="" if kv.get("PartitionName", "") in _NULL else kv["PartitionName"],
                flags=tuple(f.upper() for f in kv.get("Flags", "").split(",") if f and f not in _NULL),
            ))
        except _Bad as exc:
            raise SourceError(f"`{command}` line {n} ({name or 'no name'}): {exc}") from None
    return out


def reservations_from_json(doc: Mapping[str, Any], command: str = "scontrol show reservation --json") -> list[Reservation]:
    """Return the reservations of a JSON answer (``scontrol show reservation --json`` of 23.02+,
    slurmrestd's ``GET /slurm/<v>/reservations/``): ``start_time``/``end_time`` plain or as number
    objects, ``flags`` a list, ``accounts``/``users`` comma-separated (a leading ``-`` excludes)."""
    def one(d: Mapping[str, Any]) -> Reservation:
        name = _str(d, "name")
        if not name:
            raise _Bad("name is missing")
        start, end = _num(d.get("start_time"), "start_time"), _num(d.get("end_time"), "end_time")
        if start is None or end is None:
            raise _Bad("start_time or end_time is unset")
        nodes = tuple(expand_hostlist(_str(d, "node_list")))
        count = _num(d.get("node_count"), "node_count")
        flags = d.get("flags") or []
        if isinstance(flags, str):
            flags = [f for f in flags.split(",") if f]
        return Reservation(name=name, start_ts=start, end_ts=end, nodes=nodes,
                           node_count=int(count) if count is not None else len(nodes), state="",
                           accounts=_names(_str(d, "accounts")), users=_names(_str(d, "users")),
                           partition=_str(d, "partition"), flags=tuple(str(f).upper() for f in flags))

    return _parse_each(doc, "reservations", command, one, "name")


# -- the source ---------------------------------------------------------------------------------
class SlurmSource:
    """Read jobs and nodes from Slurm through a runner.

    :param runner: runs Slurm commands; default: on the login node over SSH when ``ssh`` (or the
        ``gpu_cost_slurm_ssh`` connection is configured in the environment), else locally.
    :param timeout: seconds per command.
    """

    def __init__(self, runner: Runner | None = None, *, ssh: bool | None = None, conn_id: str = SSH_CONN_ID,
                 timeout: float = 60.0) -> None:
        self.runner = runner if runner is not None else default_runner(ssh=ssh, conn_id=conn_id)
        self.timeout = timeout

    def _json(self, argv: Sequence[str]) -> dict[str, Any]:
        res = self.runner.run(argv, timeout=self.timeout)
        command = " ".join(argv)
        if not res.ok:
            raise SourceError(f"`{command}` exited {res.rc}: {res.stderr.strip()[:300]}")
        return load_json(res.stdout, command)

    def jobs(self) -> list[Job]:
        """Return running and pending jobs (``squeue --json``); recently finished ones are left out."""
        doc = self._json(["squeue", "--json"])
        return [j for j in parse_jobs(doc, "squeue --json") if j.running or j.pending]

    def nodes(self) -> list[Node]:
        """Return every node (``scontrol show nodes --json``, or ``sinfo --json`` on 22.05)."""
        argv = ["scontrol", "show", "nodes", "--json"]
        res = self.runner.run(argv, timeout=self.timeout)
        if not res.ok and ("unrecognized option" in res.stderr or "invalid option" in res.stderr):
            argv = ["sinfo", "--json"]
            res = self.runner.run(argv, timeout=self.timeout)
        command = " ".join(argv)
        if not res.ok:
            raise SourceError(f"`{command}` exited {res.rc}: {res.stderr.strip()[:300]}")
        return parse_nodes(load_json(res.stdout, command), command)

    def reservations(self, name: str | None = None) -> list[Reservation]:
        """Return Slurm's reservations (or the one named ``name``; [] when it does not exist)."""
        argv = list(RESERVATION_ARGV) + ([name] if name else [])
        res = self.runner.run(argv, timeout=self.timeout)
        if not res.ok:
            if name and "not found" in (res.stderr + res.stdout).lower():
                return []
            raise SourceError(f"`{' '.join(argv[2:])}` exited {res.rc}: {res.stderr.strip()[:300]}")
        return parse_reservations(res.stdout, " ".join(argv[2:]))

    def finished_jobs(self, since: object, until: object) -> list[Job]:
        """Return jobs that ended in ``[since, until)`` from accounting (``sacct --json -X``)."""
        s, u = epoch(since), epoch(until)
        argv = ["sacct", "--json", "-X", "-a", "-S", _sacct_time(s), "-E", _sacct_time(u),
                "--state=CD,CA,F,TO,NF,PR,BF,DL,OOM"]
        jobs = parse_sacct(self._json(argv), "sacct --json")
        return [j for j in jobs if j.end_ts is not None and s <= j.end_ts < u and j.state in TERMINAL_STATES]

    def job(self, job_id: str) -> Job | None:
        """Return one job as squeue shows it now, or None when Slurm no longer lists it."""
        # an array's pending record (``500_[3-9]``) is asked for by its array id; only an exact id
        # matches: a bare ``500`` is never taken to mean one of the array's tasks
        asked = check_job_id(job_id).split("_[", 1)[0]
        res = self.runner.run(["squeue", "--json", "--jobs", asked], timeout=self.timeout)
        if not res.ok:
            if "Invalid job id" in res.stderr:
                return None
            raise SourceError(f"`squeue --json --jobs {asked}` exited {res.rc}: {res.stderr.strip()[:300]}")
        for j in parse_jobs(load_json(res.stdout, "squeue --json --jobs"), "squeue --json --jobs"):
            if j.job_id == str(job_id):
                return j
        return None


def read_reservations(src: SlurmSource) -> list[Reservation]:
    """Return Slurm's reservations, or [] (with a warning) when they cannot be read: a missing list only
    means no reservation is proposed or found idle, never that one is acted on."""
    try:
        return src.reservations()
    except SourceError as exc:
        logger.warning("reservations not read: %s", exc)
        return []


def _sacct_time(ts: float) -> str:
    import datetime as dt

    # sacct reads times in the local time zone of the machine running it; send UTC-free local text
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")


def default_runner(*, ssh: bool | None = None, conn_id: str = SSH_CONN_ID) -> Runner:
    """Return the runner for Slurm commands: SSH to the login node when asked or configured, else local.

    Configured: the connection ``conn_id`` is known (its ``AIRFLOW_CONN_*`` variable, or inside
    Airflow its own lookup), or ``GPU_COST_SLURM_SSH=1``.
    """
    if ssh is None:
        from gpu_cost.core import connections

        ssh = os.environ.get("GPU_COST_SLURM_SSH", "") == "1" or connections.lookup(conn_id, SourceError) is not None
    return SSHRunner(conn_id) if ssh else LocalRunner()
