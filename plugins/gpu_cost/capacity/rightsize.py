"""Right-sizing at submission: advice on GPUs and ``--time`` from the jobs the sweeps saw finish.

Every sweep writes one ``gpu_cost_jobs_usage`` row per running job, with ``gpus_needed``: the GPUs
the job needed in that sample (:func:`gpu_cost.report.usage.gpus_needed`: busy ones, those without
fresh data, its work and its memory). Nightly, and with ``gpu-cost rightsize write``, :func:`compute`
reads the last ``rightsize.lookback`` of them:

* a job is *finished* when the sweeps stopped seeing it before the newest sweep. Its need is the
  ``quantile`` of its samples' needs; its run time runs from its start to its last sighting plus
  one sweep interval (an upper bound: advice on ``--time`` must never cut a job short), at most its
  limit. A job the agent ended (a kill, a cancel) tells nothing about how long it would have run:
  it counts for the GPUs, not for the time.
* Jobs are grouped per class (user and job name stem, :func:`gpu_cost.analyse.baselines.name_stem`) and
  per user. A group with ``min_jobs`` finished jobs gets a row. *GPUs*: the ``quantile`` of its
  jobs' needs (at least 1) is advised when it saves at least ``gpu_cut_min`` of the GPUs the group
  most often asked for; ``sbatch`` shows it to requests of ``ask_min`` GPUs or more (the smallest
  request it cuts by that share). *Time*: the ``quantile`` of the run times of the jobs that ended
  on their own, plus ``time_margin``, rounded up to ``time_round``, is advised when it is at most
  ``1 - time_cut_min`` of the median limit asked. A group with enough history and nothing to
  advise is kept as ``fits``: at ``sbatch`` the most specific row wins, so a class that uses its
  GPUs is never given its user's advice.
* With ``block``, a request of more than ``block_factor`` x the advised GPUs is refused.

:func:`publish` writes the advice file (:func:`advice_file_text`: tab-separated, read by the shipped
``include/slurm/cli_filter.lua``; its second line names the data instant, and a file of a newer instant is
never replaced by an older run's) and stores the rows in ``gpu_cost_rightsize``. :func:`followed`
counts, for the weekly report, how often the jobs that came later asked for what was advised.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import math
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpu_cost.analyse.baselines import name_stem
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy, RightsizeConfig
from gpu_cost.core import paths
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.model import KILL_ACTIONS
from gpu_cost.core.timeutil import epoch, format_duration, iso

logger = logging.getLogger(__name__)

#: first line of the advice file; the Lua script reads nothing from a file without it
FILE_MAGIC = "# gpu-cost rightsize advice v1"
#: second line: the data instant the advice was computed at (a comment to the Lua script); :func:`publish`
#: never replaces a file of a newer instant
FILE_INSTANT = "# data_ts: "
#: the advice file's columns, in order (``include/slurm/cli_filter.lua`` reads them by position)
FILE_COLUMNS = ("scope", "user", "stem", "ask_min", "gpus_advice", "block_above", "time_ask_min_s", "time_advice_s",
                "head", "gpus_text", "time_text", "block_text")
#: a time limit this close to the advice counts as following it (Slurm keeps minutes)
_TIME_SLACK_S = 60.0


@dataclass(frozen=True)
class FinishedJob:
    """A job the sweeps saw finish, as right-sizing reads it.

    :param gpus: the GPUs it asked for
    :param need: the GPUs it needed in ``rightsize.quantile`` of its samples (None: no sample says)
    :param runtime_s: start to last sighting plus one sweep interval, at most its limit
    :param natural_end: it ended on its own (the agent did not end it)
    :param spare_gpu_s: GPU-seconds it held beyond what its samples needed
    """

    job_id: str
    user: str
    stem: str
    gpus: int
    need: int | None
    mem_peak_mib: float | None
    mem_total_mib: float | None
    runtime_s: float
    time_limit_s: float | None
    natural_end: bool
    spare_gpu_s: float


@dataclass(frozen=True)
class Advice:
    """One row of advice: a job class (``scope`` class: user and name stem) or a user (stem '').

    ``status`` is ``advice`` when there is something to say (``gpus_advice`` or ``time_advice_s``
    non-zero) and ``fits`` otherwise; the ``*_text`` fields are the lines ``sbatch`` shows.
    """

    scope: str
    user: str
    stem: str
    status: str
    jobs: int
    gpus_asked: int
    gpus_need: int
    gpus_advice: int
    ask_min: int
    block_above: int
    mem_peak_mib: float | None
    mem_total_mib: float | None
    time_jobs: int
    time_asked_s: float | None
    runtime_s: float | None
    time_advice_s: float
    time_ask_min_s: float
    idle_gpu_hours: float
    head: str = ""
    gpus_text: str = ""
    time_text: str = ""
    block_text: str = ""

    @property
    def text(self) -> str:
        """Return the advice in words, one line."""
        parts = [self.gpus_text if self.gpus_advice else "", self.time_text if self.time_advice_s else ""]
        return " ".join([self.head, *(p for p in parts if p)]) if self.status == "advice" else ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text}


# -- the maths ----------------------------------------------------------------------------------
def quantile(values: Iterable[float], q: float) -> float | None:
    """Return the nearest-rank ``q`` quantile (the smallest value with at least ``q`` of them at or under it)."""
    xs = sorted(values)
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs) - 1e-9) - 1))]


def histogram_quantile(counts: Mapping[int, int], q: float) -> int | None:
    """Return the nearest-rank ``q`` quantile of values given as value → how many times."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total - 1e-9))
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= rank:
            return int(value)
    return int(max(counts))


def round_up(seconds: float, step: float) -> float:
    """Return ``seconds`` rounded up to a multiple of ``step`` (at least one step)."""
    return max(step, math.ceil(seconds / step - 1e-9) * step)


def ask_min(advice: int, cut: float) -> int:
    """Return the smallest request of GPUs that ``advice`` cuts by at least the share ``cut``."""
    return max(advice + 1, math.ceil(advice / (1.0 - cut) - 1e-9))


def advise(jobs: Sequence[FinishedJob], cfg: RightsizeConfig) -> list[Advice]:
    """Return a row per class and per user with ``cfg.min_jobs`` finished jobs (see the module docstring)."""
    groups: dict[tuple[str, str, str], list[FinishedJob]] = defaultdict(list)
    for j in jobs:
        if j.stem:
            groups[("class", j.user, j.stem)].append(j)
        groups[("user", j.user, "")].append(j)
    out = []
    for (scope, user, stem), members in sorted(groups.items()):
        if len(members) >= cfg.min_jobs:
            out.append(_advise_group(scope, user, stem, members, cfg))
    return out


def _advise_group(scope: str, user: str, stem: str, members: Sequence[FinishedJob], cfg: RightsizeConfig) -> Advice:
    asks = Counter(j.gpus for j in members)
    asked = max(asks, key=lambda g: (asks[g], g))
    needs = [j.need for j in members if j.need is not None]
    need = int(quantile(needs, cfg.quantile) or 0) if len(needs) >= cfg.min_jobs else asked
    gpus_advice = max(1, need)
    if gpus_advice >= asked or gpus_advice > asked * (1.0 - cfg.gpu_cut_min) + 1e-9:
        gpus_advice = 0
    mems = [j.mem_peak_mib for j in members if j.mem_peak_mib is not None]
    totals = [j.mem_total_mib for j in members if j.mem_total_mib]
    natural = [j for j in members if j.natural_end]
    runtime = quantile([j.runtime_s for j in natural], cfg.quantile) if len(natural) >= cfg.min_jobs else None
    limits = [float(j.time_limit_s) for j in members if j.time_limit_s and j.time_limit_s > 0]
    time_asked = _median(limits) if limits else None
    time_advice = 0.0
    if runtime is not None and time_asked is not None:
        proposal = round_up(runtime * (1.0 + cfg.time_margin), cfg.time_round)
        if proposal <= time_asked * (1.0 - cfg.time_cut_min) + 1e-6:
            time_advice = proposal
    return Advice(
        scope=scope, user=user, stem=stem, status="advice" if gpus_advice or time_advice else "fits",
        jobs=len(members), gpus_asked=asked, gpus_need=need, gpus_advice=gpus_advice,
        ask_min=ask_min(gpus_advice, cfg.gpu_cut_min) if gpus_advice else 0,
        block_above=math.ceil(cfg.block_factor * gpus_advice - 1e-9) if cfg.block and gpus_advice else 0,
        mem_peak_mib=quantile(mems, cfg.quantile) if mems else None, mem_total_mib=min(totals) if totals else None,
        time_jobs=len(natural), time_asked_s=time_asked, runtime_s=runtime, time_advice_s=time_advice,
        time_ask_min_s=round(time_advice / (1.0 - cfg.time_cut_min), 1) if time_advice else 0.0,
        idle_gpu_hours=round(sum(j.spare_gpu_s for j in members) / 3600.0, 2),
    )


def _median(values: Sequence[float]) -> float:
    xs = sorted(values)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2.0


# -- history ------------------------------------------------------------------------------------
def finished_jobs(store: AuditStore, policy: Policy, now: float) -> list[FinishedJob]:
    """Return the GPU jobs the sweeps saw finish in the ``rightsize.lookback`` before ``now``."""
    cfg = policy.rightsize
    window = {"since": now - cfg.lookback, "until": now}
    rows = store.fetch("rightsize_jobs", window)
    if not rows:
        return []
    newest = max(float(r["last_seen"]) for r in rows)
    done = [r for r in rows if float(r["last_seen"]) < newest - 0.5 * float(r["interval_s"] or 0.0)]
    hist: dict[str, dict[int, int]] = defaultdict(dict)
    for h in store.fetch("rightsize_needs", window):
        hist[str(h["job_id"])][int(h["gpus_needed"])] = int(h["n"])
    ended = _ended_by_agent(store, [str(r["job_id"]) for r in done], window["since"])
    out = []
    for r in done:
        jid = str(r["job_id"])
        interval = float(r["interval_s"] or 0.0)
        start = float(r["start_ts"]) if r.get("start_ts") is not None else float(r["first_seen"]) - interval
        limit = float(r["time_limit_s"]) if r.get("time_limit_s") else None
        runtime = max(0.0, float(r["last_seen"]) + interval - start)
        if limit:
            runtime = min(runtime, limit)
        out.append(FinishedJob(
            job_id=jid, user=str(r["user_name"] or ""), stem=name_stem(str(r.get("job_name") or "")),
            gpus=int(r["gpus_requested"] or r["gpus"] or 0) or int(r["gpus"] or 0),
            need=histogram_quantile(hist[jid], cfg.quantile) if jid in hist else None,
            mem_peak_mib=float(r["mem_max_mib"]) if r.get("mem_max_mib") is not None else None,
            mem_total_mib=float(r["mem_total_mib"]) if r.get("mem_total_mib") else None,
            runtime_s=round(runtime, 1), time_limit_s=limit, natural_end=jid not in ended,
            spare_gpu_s=float(r.get("spare_gpu_s") or 0.0),
        ))
    return [j for j in out if j.user and j.gpus > 0]


def _ended_by_agent(store: AuditStore, job_ids: Sequence[str], since: float) -> set[str]:
    """Return the jobs among ``job_ids`` that the agent's own actions ended (not in dry-run)."""
    out: set[str] = set()
    targets = [f"job:{j}" for j in job_ids]
    for i in range(0, len(targets), 500):
        for r in store.fetch("succeeded_actions_on", {"targets": targets[i:i + 500], "actions": sorted(KILL_ACTIONS),
                                                      "since": since}):
            out.add(str(r["target"]).split(":", 1)[1])
    return out


def compute(store: AuditStore, policy: Policy, now: float) -> list[Advice]:
    """Return the advice rows (with their text) as of ``now``, from the audit store's job rows."""
    cfg = policy.rightsize
    jobs = finished_jobs(store, policy, now)
    rows = [_with_text(a, cfg) for a in advise(jobs, cfg)]
    logger.info("right-sizing at %s: %d finished GPU jobs, %d rows, %d with advice", iso(now), len(jobs), len(rows),
                sum(1 for a in rows if a.status == "advice"))
    return rows


# -- words --------------------------------------------------------------------------------------
@functools.cache
def _macros() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.include_dir() / "templates" / "rightsize")),
                             autoescape=False, undefined=jinja2.StrictUndefined, trim_blocks=True,  # noqa: S701 - plain text
                             lstrip_blocks=True)
    return env.get_template("advice.txt.j2").module


def slurm_time(seconds: float) -> str:
    """Return a duration as Slurm's ``--time`` takes it: ``H:MM:SS`` or ``D-HH:MM:SS``."""
    total = math.ceil(seconds)
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h}:{m:02d}:{s:02d}"


def _gib(mib: float | None) -> str | None:
    return None if mib is None else f"{mib / 1024.0:.1f} GiB"


def _with_text(a: Advice, cfg: RightsizeConfig) -> Advice:
    from dataclasses import replace

    view = {
        "scope": a.scope, "user": a.user, "stem": a.stem, "jobs": a.jobs, "lookback": format_duration(cfg.lookback),
        "share": round(100 * cfg.quantile), "gpus_asked": a.gpus_asked, "gpus_need": a.gpus_need,
        "gpus_advice": a.gpus_advice, "block_above": a.block_above, "mem_peak": _gib(a.mem_peak_mib),
        "mem_total": _gib(a.mem_total_mib), "time_jobs": a.time_jobs,
        "runtime": slurm_time(a.runtime_s) if a.runtime_s is not None else None,
        "time_asked": slurm_time(a.time_asked_s) if a.time_asked_s else None,
        "time_advice": slurm_time(a.time_advice_s) if a.time_advice_s else None,
    }
    m = _macros()
    return replace(a, head=_line(m.head(view)) if a.status == "advice" else "", gpus_text=_line(m.gpus(view)) if a.gpus_advice else "",
                   time_text=_line(m.time(view)) if a.time_advice_s else "",
                   block_text=_line(m.block(view)) if a.block_above else "")


def _line(text: object) -> str:
    """Return ``text`` on one line: no tabs, no line breaks, no other control characters."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())


# -- publishing ---------------------------------------------------------------------------------
def advice_path(policy: Policy, out: str | os.PathLike[str] | None = None) -> Path | None:
    """Return where the advice file goes: ``out``, else ``rightsize.advice_file`` (relative: under
    the state folder); None when the policy names none."""
    chosen = str(out) if out else policy.rightsize.advice_file
    if not chosen.strip():
        return None
    p = Path(chosen).expanduser()
    return p if p.is_absolute() else (Path.cwd() if out else paths.state_dir()) / p


def advice_file_text(rows: Sequence[Advice], now: float, cfg: RightsizeConfig) -> str:
    """Return the advice file: a magic line, comments, then one tab-separated line per row
    (:data:`FILE_COLUMNS`), classes first; the same rows give the same bytes."""
    lines = [FILE_MAGIC, f"{FILE_INSTANT}{iso(now)}",
             f"# from the GPU jobs that finished in the {format_duration(cfg.lookback)} before {iso(now)}; "
             "written by gpu-cost (gpu_forecast_nightly or `gpu-cost rightsize write`): do not edit",
             "# " + "\t".join(FILE_COLUMNS)]
    order = {"class": 0, "user": 1}
    for a in sorted(rows, key=lambda r: (order.get(r.scope, 2), r.user, r.stem)):
        fields = [a.scope, a.user, a.stem, a.ask_min, a.gpus_advice, a.block_above, round(a.time_ask_min_s),
                  round(a.time_advice_s), a.head, a.gpus_text, a.time_text, a.block_text]
        lines.append("\t".join(_line(f) for f in fields))
    return "\n".join(lines) + "\n"


def file_instant(path: Path) -> float | None:
    """Return the data instant of the advice file at ``path``; None when there is none, it is not an advice
    file, or an earlier version wrote it (no instant line)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            head = [fh.readline().rstrip("\n") for _ in range(2)]
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GpuCostError(f"cannot read the right-sizing advice file {path}: {exc}") from exc
    if head[0] != FILE_MAGIC or not head[1].startswith(FILE_INSTANT):
        return None
    try:
        return epoch(head[1][len(FILE_INSTANT):].strip())
    except ValueError:
        logger.warning("advice file %s: unreadable instant line %r; replaced", path, head[1][:80])
        return None


def write_file(path: Path, text: str, now: float | None = None) -> float | None:
    """Replace ``path`` with ``text`` atomically (readers see the old file or the new one), mode 0644.

    With ``now`` (the data instant of ``text``), a file of a newer instant is left as it is and its
    instant returned (None: written). The look and the replacement hold a lock on the folder, so of
    two writers racing the newer instant wins.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            newer = file_instant(path) if now is not None else None
            if newer is not None and now is not None and newer > now:
                return newer
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, 0o644)  # sbatch runs as each user: everyone reads it (it holds no secret)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            return None
        finally:
            os.close(folder)  # releases the lock
    except OSError as exc:
        raise GpuCostError(f"cannot write the right-sizing advice file {path}: {exc}") from exc


def publish(store: AuditStore, policy: Policy, now: float, *, run_id: str | None = None,
            out: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Compute the advice as of ``now``, write the advice file and store the rows; return a summary.

    Idempotent: the same history and instant write the same file and rows. A file of a newer instant
    (a later run's; this one is an older nightly run again) is left as it is: the summary's ``file``
    is None and ``kept`` names it; the rows are stored under their own instant, as not published.
    """
    cfg = policy.rightsize
    rows = compute(store, policy, now)
    path = advice_path(policy, out)
    kept: dict[str, str] | None = None
    if path is not None:
        newer = write_file(path, advice_file_text(rows, now, cfg), now)
        if newer is None:
            logger.info("right-sizing advice written to %s (%d rows)", path, len(rows))
        else:
            kept = {"file": str(path), "at": iso(newer)}
            logger.warning("right-sizing advice as of %s not written: %s holds newer advice (as of %s)", iso(now),
                           path, iso(newer))
            path = None
    stored = [{**{k: v for k, v in a.to_dict().items() if k not in ("head", "gpus_text", "time_text", "block_text")},
               "user_name": a.user, "data_ts": now, "advice_file": str(path) if path else None, "run_id": run_id}
              for a in rows]
    for r in stored:
        r.pop("user")
    store.execute("upsert_rightsize", stored)
    out_summary = {**summary(rows), "at": iso(now), "file": str(path) if path else None}
    return {**out_summary, "kept": kept} if kept else out_summary


def summary(rows: Sequence[Advice]) -> dict[str, Any]:
    """Return counts of a set of advice rows (XCom, the command line)."""
    advised = [a for a in rows if a.status == "advice"]
    return {"rows": len(rows), "advice": len(advised), "users": len({a.user for a in advised}),
            "gpu_advice": sum(1 for a in advised if a.gpus_advice), "time_advice": sum(1 for a in advised if a.time_advice_s),
            "blocking": sum(1 for a in advised if a.block_above),
            "idle_gpu_hours": round(sum(a.idle_gpu_hours for a in advised if a.scope == "user" and a.gpus_advice), 1)}


# -- was it followed? ---------------------------------------------------------------------------
def in_force(index: Mapping[tuple[str, str, str], Mapping[str, Any]], user: str,
             stem: str) -> Mapping[str, Any] | None:
    """Return the row ``sbatch`` uses for a job of ``user`` named like ``stem``: its class's, else its user's.

    :param index: rows by ``(scope, user, stem)`` (:func:`index_rows`)
    """
    return (index.get(("class", user, stem)) if stem else None) or index.get(("user", user, ""))


def index_rows(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """Return stored advice rows by ``(scope, user, stem)``."""
    return {(str(r["scope"]), str(r["user_name"]), str(r["stem"] or "")): r for r in rows}


def verdict(row: Mapping[str, Any], gpus: int, time_limit_s: float | None) -> tuple[bool | None, bool | None]:
    """Return whether a job asking ``gpus`` and ``time_limit_s`` followed ``row``'s GPU and time advice.

    GPUs: at most the advice followed it; ``ask_min`` or more (what ``sbatch`` showed the advice to)
    did not; in between, or no GPU advice: None (not counted). Time: a limit at most the advice
    (within a minute) followed it; one of ``time_ask_min_s`` or more, or no limit known, did not.
    """
    g: bool | None = None
    advice = int(row["gpus_advice"] or 0)
    if advice:
        g = True if gpus <= advice else (False if gpus >= int(row["ask_min"] or 0) else None)
    t: bool | None = None
    t_advice = float(row["time_advice_s"] or 0.0)
    if t_advice:
        if time_limit_s is not None and time_limit_s <= t_advice + _TIME_SLACK_S:
            t = True
        elif time_limit_s is None or time_limit_s >= float(row["time_ask_min_s"] or 0.0):
            t = False
    return g, t


def followed(store: AuditStore, since: float, until: float, top: int = 10) -> dict[str, Any] | None:
    """Return how often the GPU jobs started in ``[since, until)`` followed the advice in force when they started.

    The advice in force at an instant is the newest stored set at or before it (what the file then
    said); a job is judged by :func:`verdict` against the row :func:`in_force` picks, and counts once:
    followed when every part it is counted for was. None when no advice was ever stored by ``until``.
    """
    instants = sorted(float(r["data_ts"]) for r in store.fetch("rightsize_instants", {"until": until, "limit": 1000}))
    if not instants:
        return None
    older = [t for t in instants if t <= since]
    sets: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in store.fetch("rightsize_between", {"since": older[-1] if older else instants[0], "until": until}):
        sets[float(r["data_ts"])].append(r)
    times = sorted(sets)
    indexes = {t: index_rows(sets[t]) for t in times}
    jobs = store.fetch("rightsize_jobs_started", {"since": since, "until": until, "start_since": since,
                                                  "start_until": until})
    parts = {"gpus": {"advised": 0, "followed": 0}, "time": {"advised": 0, "followed": 0}}
    per_user: dict[str, dict[str, int]] = defaultdict(lambda: {"advised": 0, "followed": 0})
    counted = ok = 0
    for j in jobs:
        start = float(j["start_ts"])
        at = [t for t in times if t <= start]
        if not at:
            continue
        row = in_force(indexes[at[-1]], str(j["user_name"] or ""), name_stem(str(j.get("job_name") or "")))
        if row is None or row["status"] != "advice":
            continue
        limit = float(j["time_limit_s"]) if j.get("time_limit_s") else None
        verdicts = dict(zip(("gpus", "time"), verdict(row, int(j["gpus_requested"] or j["gpus"] or 0), limit),
                            strict=True))
        seen = [v for v in verdicts.values() if v is not None]
        if not seen:
            continue
        for part, v in verdicts.items():
            if v is not None:
                parts[part]["advised"] += 1
                parts[part]["followed"] += int(v)
        counted += 1
        ok += int(all(seen))
        u = per_user[str(j["user_name"])]
        u["advised"] += 1
        u["followed"] += int(all(seen))
    latest = sets[times[-1]] if times else []
    users = sorted(per_user.items(), key=lambda kv: (kv[1]["followed"] - kv[1]["advised"], -kv[1]["advised"], kv[0]))
    return {
        "published_at": iso(times[-1]) if times else None,
        "advice_rows": sum(1 for r in latest if r["status"] == "advice"),
        "advised_users": len({r["user_name"] for r in latest if r["status"] == "advice"}),
        "blocking": any(int(r["block_above"] or 0) for r in latest),
        "advised_jobs": counted, "followed": ok, "followed_share": round(ok / counted, 3) if counted else None,
        "gpus": parts["gpus"], "time": parts["time"],
        "by_user": [{"user": k, **v, "ignored": v["advised"] - v["followed"]} for k, v in users[:top]],
    }
