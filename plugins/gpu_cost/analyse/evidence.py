"""Evidence beyond one job's utilisation: the job's log, signs of progress, and a confidence.

A rule that finds a job idle asks here what else is known about it:

* **the log** (``snapshot.job_logs[job_id]``, the tail of its StdOut/StdErr as the node wrapper's
  read-only ``job-log`` verb returned it, or as a trace's ``logs`` file had it by then): a line
  matching ``evidence.job_log.finished`` or ``crashed`` makes the finding stronger (the work is
  over, the GPUs are held for nothing); ``waiting`` names a job waiting for input; a log written
  within the rule window is activity. With it comes the newest file the job owns in its working
  directory or one level below (``workdir_mtime``/``workdir_newest``: metadata the wrapper read,
  never the file).
* **progress**: the log written within the window, a file in the working directory written within
  the window (a checkpoint or an output being written: progress even when the log says the job
  finished or crashed — a final checkpoint), mean GPU power above ``evidence.power_active_w``,
  or the node's CPU or I/O busy (``evidence.cpu_busy``, ``io_busy_mib_s``: node_exporter) on a node the job has to itself — a data-loading
  or checkpointing phase, not waste. On any node, shared or not, the job's own processes count
  too (``cpu_cores``/``io_bps``, which the wrapper sampled over a second): at least
  ``evidence.job_cpu_cores`` CPU cores, or reads and writes of at least ``io_busy_mib_s``.
* **confidence** that the finding is waste, from 0 to 1, with the reasons that moved it.

Each piece is a small dict ``{"what": ..., "value": ..., "counted": ...}`` in the finding's
evidence under ``"signals"``, so the notice and ``gpu-cost audit`` say in plain words why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from gpu_cost.config.schema import JobLogConfig, Policy
from gpu_cost.core.model import Job, Snapshot

#: log states, strongest first: a crash or a finish says the work is over
LOG_STATES = ("crashed", "finished", "waiting")
#: confidence of a finding with utilisation alone
BASE_CONFIDENCE = 0.7


@lru_cache(maxsize=64)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.IGNORECASE | re.MULTILINE) for p in patterns)


def classify_log(log: Mapping[str, Any] | None, cfg: JobLogConfig, now: float, window: float) -> dict[str, Any]:
    """Return what a job's log tail says: ``state`` (crashed, finished, waiting or None), the line
    and pattern that said it, ``written_s_ago`` and ``growing`` (written within ``window``), and the
    same for the newest file in the job's working directory: ``files_written_s_ago``,
    ``files_growing`` and ``files_newest`` (its name), from ``log["workdir_mtime"]`` and
    ``log["workdir_newest"]`` (known even when the log itself could not be read), and
    ``cpu_cores``/``io_bps`` of the job's own processes as the wrapper sampled them (None: unknown).

    The *last* matching line wins within the tail. A job that crashed or finished and then wrote
    :data:`MOVED_ON_LINES` or more ordinary lines (its own script restarted it) has no verdict:
    ``state`` is None (``earlier_state`` keeps it), and a growing log is activity again.
    """
    out: dict[str, Any] = {"state": None, "line": None, "pattern": None, "written_s_ago": None, "growing": False,
                           "read": False, "files_written_s_ago": None, "files_growing": False, "files_newest": None,
                           "cpu_cores": None, "io_bps": None}
    if not log:
        return out
    out.update(process_load(log))
    wd_mtime = log.get("workdir_mtime")
    if isinstance(wd_mtime, int | float) and not isinstance(wd_mtime, bool) and wd_mtime == wd_mtime:
        ago = max(0.0, now - float(wd_mtime))
        out["files_written_s_ago"] = round(ago)
        out["files_growing"] = ago <= window
        out["files_newest"] = log.get("workdir_newest")
    if log.get("error"):
        out["error"] = str(log["error"])
        return out
    out["read"] = True
    text = str(log.get("text") or "")
    mtime = log.get("mtime")
    if mtime is not None:
        ago = max(0.0, now - float(mtime))
        out["written_s_ago"] = round(ago)
        out["growing"] = ago <= window
    state, line, pattern, earlier = _verdict(text, tuple(cfg.finished), tuple(cfg.crashed), tuple(cfg.waiting))
    out["state"], out["line"], out["pattern"] = state, line, pattern
    if earlier is not None:
        out["earlier_state"] = earlier
    return out


def process_load(log: Mapping[str, Any] | None) -> dict[str, float | None]:
    """Return ``cpu_cores`` and ``io_bps`` of the job's own processes as the node wrapper sampled them with its log
    (None: unknown): what :func:`classify_log` reports of them, without reading the log's lines."""
    out: dict[str, float | None] = {"cpu_cores": None, "io_bps": None}
    for key in out:
        value = (log or {}).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
            out[key] = float(value)
    return out


@lru_cache(maxsize=1024)
def _verdict(text: str, finished: tuple[str, ...], crashed: tuple[str, ...],
             waiting: tuple[str, ...]) -> tuple[str | None, str | None, str | None, str | None]:
    """Return what a log tail's lines say: (state, the line, the pattern, the state it had before the job
    went on) -- a function of the text and the patterns alone, so each tail is read once however many
    rules ask about it in a sweep, and again only once new lines change it (a tail is at most
    ``evidence.job_log.max_bytes``; the 1,024 newest are kept)."""
    best: tuple[int, str, str, str] | None = None  # (offset, state, line, pattern)
    for state, patterns in zip(LOG_STATES, (crashed, finished, waiting), strict=True):
        for pat, rx in zip(patterns, _compiled(patterns), strict=True):
            for m in rx.finditer(text):
                if best is None or m.start() > best[0]:
                    start = text.rfind("\n", 0, m.start()) + 1
                    end = text.find("\n", m.end())
                    line = text[start:end if end >= 0 else len(text)].strip()
                    best = (m.start(), state, line[:200], pat)
    if best is None:
        return None, None, None, None
    end = text.find("\n", best[0])
    later = [x for x in (text[end + 1:].splitlines() if end >= 0 else []) if _moves_on(x)]
    if len(later) >= MOVED_ON_LINES:
        # the job went on after it (a restart from a checkpoint): the newest lines decide, not the old verdict
        return None, best[2], best[3], best[1]
    return best[1], best[2], best[3], None


#: lines of ordinary output after a finish or a crash that mean the job went on (restarted, resumed)
MOVED_ON_LINES = 2
_TRACE_LINE = re.compile(
    r"^(\s|\w+(\.\w+)*(Error|Exception|Warning)\b|During handling|The above exception"
    # what launchers and libraries print after a job's own last words: not the job going on
    r"|srun: |slurmstepd: |wandb: |torchrun|\[rank\d*\]|[=*\-]{3,}\s*$|Root Cause|error_file|traceback :"
    r"|.*(CUDA_LAUNCH_BLOCKING|TORCH_USE_CUDA_DSA|ChildFailedError|torch\.distributed|kernel errors might))",
    re.IGNORECASE)


def _moves_on(line: str) -> bool:
    """True for a line of ordinary output: not blank, not a traceback frame or an exception line."""
    return bool(line.strip()) and not _TRACE_LINE.match(line)


def progress(snapshot: Snapshot, job: Job, power_w: Sequence[float], log: Mapping[str, Any], policy: Policy) -> list[str]:
    """Return the signs that an idle-looking job is working (empty: none)."""
    ev = policy.evidence
    signs = []
    if log.get("growing") and log.get("state") not in ("crashed", "finished"):
        signs.append(f"its log was written {log.get('written_s_ago')} s ago")
    if log.get("files_growing"):  # even after "finished" or a crash: a final checkpoint being written
        newest = log.get("files_newest")
        signs.append(f"a file in its working directory{f' ({newest})' if newest else ''} was written "
                     f"{log.get('files_written_s_ago')} s ago")
    cores, io = log.get("cpu_cores"), log.get("io_bps")
    if cores is not None and cores >= ev.job_cpu_cores:
        signs.append(f"its processes use {cores:.1f} CPU cores")
    if io is not None and io >= ev.io_busy_mib_s * 1048576:
        mib = io / 1048576
        signs.append(f"its processes read and write {mib:.0f} MiB/s" if mib >= 10 else
                     f"its processes read and write {mib:.1f} MiB/s")
    watts = [w for w in power_w if w == w]
    if watts and max(watts) > ev.power_active_w:
        signs.append(f"GPU power {max(watts):.0f} W, above the {ev.power_active_w:g} W of an idle GPU")
    alone = nodes_to_itself(snapshot, job)
    for node in snapshot.nodes_named(alone):
        if node.name in alone and node.cpu_util is not None and node.cpu_util >= ev.cpu_busy:
            signs.append(f"node {node.name}'s CPU {node.cpu_util:.0f} % busy (the job has it to itself)")
        if node.name in alone and node.io_bps is not None and node.io_bps >= ev.io_busy_mib_s * 1048576:
            signs.append(f"node {node.name} moves {node.io_bps / 1048576:.0f} MiB/s over network and disk "
                         "(the job has it to itself)")
    return signs


def nodes_to_itself(snapshot: Snapshot, job: Job) -> set[str]:
    """Return the nodes of ``job`` no other running job uses."""
    users = snapshot.jobs_by_node()
    jid = job.job_id
    # a node is the job's alone when no other job is on it: nobody, or the job itself only
    return {n for n in (job.nodes or [h for h, _ in job.gpu_alloc])
            if not (on := users.get(n)) or (len(on) == 1 and jid in on)}


def confidence(log: Mapping[str, Any], klass: Mapping[str, Any] | None, *, bursts: int = 0,
               progress_signs: Iterable[str] = (), resident: bool | None = None,
               measured: bool = True) -> tuple[float, list[str]]:
    """Return how sure the agent is that an idle finding is waste (0-1) and what moved it.

    :param resident: the GPUs hold memory (a model loaded, or a process lingering); False: empty.
        Memory held at 0 % with nothing in the log saying the work is over is what a quiet
        inference endpoint looks like, so it lowers the confidence below ``evidence.min_confidence``
        by default: the destructive rungs then wait for a human unless the class baseline or the
        log decides.
    :param measured: False when no sample of the GPUs' memory was there to read (a trace of utilisation alone, an
        exporter without the framebuffer metric): nothing then says the GPUs are empty, and a waiting model cannot
        be told from a finished job, so it counts as memory held would.
    """
    c, why = BASE_CONFIDENCE, [f"utilisation alone: {BASE_CONFIDENCE:g}"]
    state = log.get("state")
    if state in ("finished", "crashed"):
        c += 0.25
        why.append(f"+0.25 the log says it {state}")
    elif (log.get("read") and log.get("written_s_ago") is not None and not log.get("growing")
          and resident is not True and measured):
        # a model loaded and waiting for requests writes nothing either: quiet says something only of empty GPUs
        c += 0.05
        why.append("+0.05 its log is quiet")
    if resident is True:
        c -= 0.25
        why.append("-0.25 memory resident: a model may be waiting for requests")
    elif not measured:
        c -= 0.25
        why.append("-0.25 GPU memory not measured: a model may be waiting for requests")
    elif resident is False:
        c += 0.1
        why.append("+0.1 nothing in GPU memory: nothing to serve")
    if list(progress_signs):
        c -= 0.4
        why.append("-0.4 signs of progress")
    if klass and klass.get("kind") == "service":
        c -= 0.3
        why.append("-0.3 its class behaves like a service")
    if bursts:
        c -= 0.1
        why.append(f"-0.1 {bursts} burst(s) of activity in the lookback")
    return round(min(1.0, max(0.0, c)), 2), why


#: what a finding's evidence keeps of its class baseline (``evidence["class"]``)
CLASS_KEYS = ("key", "members", "kind", "member_kind", "busy_share", "waking_share", "mem_resident_share")


def assess(snapshot: Snapshot, job: Job, policy: Policy, *, session: bool = False) -> dict[str, Any] | None:
    """Return what the idle rules' evidence would say of ``job`` now, for a way in that has no finding
    (a manual request): ``mem_resident``, ``confidence`` and ``confidence_why``, and its ``class``.

    None unless every GPU of the job is seen fresh and idle to the idle rule that judges it, over that rule's window
    and under its threshold (``rules.idle_interactive`` for an interactive ``session``, as
    :func:`gpu_cost.analyse.rules.common.interactive_session` tells one, else ``rules.idle_allocation``): a busy
    job is no recommendation of the agent's to doubt.
    """
    import numpy as np

    cfg: Any = policy.rules.idle_interactive if session else policy.rules.idle_allocation
    try:
        g = snapshot.columns(cfg.window)
    except KeyError:
        return None
    if g.empty or "job_id" not in g:
        return None
    pos = np.flatnonzero(g.get("job_id", object) == job.job_id)
    if not len(pos) or len(pos) < len(job.gpu_keys()):
        return None
    umax = g.get("util_max", float)[pos]
    if g.get("stale", bool)[pos].any() or np.isnan(umax).any() or not (umax < cfg.util_max).all():
        return None
    memmin = g.get("mem_min_mib", float)[pos]
    resident = None if np.isnan(memmin).all() else bool(float(np.nanmin(memmin)) > policy.rules.zombie.mem_min_mib)
    log = classify_log(snapshot.job_logs.get(job.job_id), policy.evidence.job_log, snapshot.ts, cfg.window)
    power = g.get("power_w", float)[pos] if "power_w" in g else []
    bursts = int(np.max(g.get("bursts_lb")[pos])) if "bursts_lb" in g else 0
    klass = snapshot.classes.get(job.job_id)
    conf, why = confidence(log, klass, bursts=bursts, progress_signs=progress(snapshot, job, list(power), log, policy),
                           resident=resident, measured=resident is not None)
    out: dict[str, Any] = {"mem_resident": resident, "confidence": conf, "confidence_why": why}
    if resident is None:
        out["mem_measured"] = False
    if klass:
        out["class"] = {k: klass.get(k) for k in CLASS_KEYS}
    return out


def signal(what: str, value: Any, counted: str) -> dict[str, Any]:
    """Return one piece of evidence: what was read, its value, why it counted."""
    return {"what": what, "value": value, "counted": counted}


def tail_lines(lines: Iterable[str], max_bytes: int) -> str:
    """Return the last lines of ``lines`` that fit in ``max_bytes`` (UTF-8), oldest first."""
    kept: list[str] = []
    size = 0
    for line in reversed(list(lines)):
        n = len(line.encode("utf-8", "replace")) + 1
        if size + n > max_bytes:
            break
        kept.append(line)
        size += n
    return "\n".join(reversed(kept))
