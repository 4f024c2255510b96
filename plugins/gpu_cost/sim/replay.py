"""What-if replay: run the sweep's own rules and engine over a trace, in simulated time.

The trace (samples + jobs, the project's trace format) is made dense once — one GPU x time
matrix — and a sweep is simulated every ``sweep.interval``: the window before each instant is a
slice of that matrix, the snapshot, rules, engine, escalation ladder, protections, snoozes and
caps are the production ones, and escalation state lives in a throwaway audit store (a temporary SQLite file).
By default the policy is replayed *as if enforced* (``mode``), and decisions that need approval
are taken as approved (``approvals``): ``approve``, ``reject``, or ``owner`` — only the target
owner's own "release it now" answer (:func:`gpu_cost.decide.answers.owner_releases`, from the store the
replay is given) lets a destructive rung act; without one nothing destructive happens. Every
destructive rung that needed a human (under ``owner``: every destructive rung) is listed in
``human_asked`` with the confidence the human would have seen, and counted in ``human_asked_count``.

The acting decisions are carried out through the one act path every way in ends with
(:func:`gpu_cost.act.dispatch.execute`): once the simulated humans have answered (``approvals``, recorded
in the store as an approver's answer would be), each goes through the audit rows before and after,
the effect guard and the rolling caps over every way in (the replay counts as the sweep), the
escalation ladder and the savings ledger; only the executor differs — one that acts on the trace
(:class:`_TraceEffects`), in trace time.

Simulated effects: a kill (``terminate``, ``kill``, ``cancel``, ``kill_process``) frees the
allocation from the kill on — its GPUs read idle and empty, with no power (a trace's ``power_w`` is read as a
live sweep reads DCGM's: above ``evidence.power_active_w``, progress), the job leaves the running set — and
frees ``GPUs x (would-have-ended - kill)`` GPU-hours (``reclaimed_gpu_hours``). A kill is *false*
when the killed GPUs were active (utilisation at or above the rule's idle threshold) within the
rule window before the kill or at any time after it in the trace. Other actions (notices, demote,
hold, requeue) change nothing in the trace.

``reclaimed_gpu_hours`` uses the trace's own end of each job, which nobody knows when acting. The
savings ledger books what the live agent would have booked, through the same
:func:`gpu_cost.act.savings.saving_row` (bounded by the waste already seen on the target), with
the usage record every sweep writes, so the report's *re-used* figure comes out of the same
:func:`gpu_cost.report.ledger.reused`: ``ledger`` gives *freed*, *re-used* and, beside them, the
idle GPU-hours measured in the trace on the acted targets before each action — the invariant
``re-used <= freed <= observed waste`` holds per target.

A jobs-only trace (no samples) cannot show idle or zombie GPUs: the replay says so and reports
only the allocated GPU-hours.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_cost.act.base import ActionContext, Outcome
from gpu_cost.config.schema import Policy
from gpu_cost.core.errors import TraceError
from gpu_cost.core.model import KILL_ACTIONS, Decision, GpuProcess, Job
from gpu_cost.core.registry import names as _action_names
from gpu_cost.core.timeutil import iso
from gpu_cost.perceive.correlate import some
from gpu_cost.perceive.trace import (
    SAMPLE_COLUMNS,
    _epoch_col,
    check_job_clock,
    labelled_starts,
    managed_hosts,
    normalise_jobs,
    normalise_samples,
    read_table,
    release_arrow_memory,
    trace_job,
    whole_nodes,
)

logger = logging.getLogger(__name__)
#: the replay's first sweep waits for rule windows up to this long to fill
FIRST_SWEEP_MAX_WAIT = 3600.0
#: actions that tell someone (the first one is the "first notice")
NOTICE_ACTIONS = _action_names(notice=True)
#: how a replay answers what needs a human (``owner``: only the owner's release, none without one)
APPROVALS = ("approve", "reject", "owner")

JOBS_ONLY_NOTE = ("jobs-only trace: it has no GPU samples, so no rule can see an idle allocation or a zombie "
                  "process and the policy would decide nothing; only allocated GPU-hours are reported. "
                  "Replay a trace with samples (ts, host, gpu, util, mem_used_mib) to test a policy.")


# -- reading traces --------------------------------------------------------------------------
#: sample columns a replay reads (others are left on disk: a 10 M-row trace must fit in memory)
REPLAY_SAMPLE_COLUMNS = (*SAMPLE_COLUMNS, "job_id", "pid", "user", "model", "power_w")
#: the samples' text columns, read as categoricals: the replay only ever factorises them
TEXT_COLUMNS = ("host", "job_id", "user", "model")


def _text_codes(col: pd.Series, missing: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Return ``(codes, names)``: each row's code into the sorted distinct texts ``names`` (a missing value reads ``missing``).

    Categorical or not, a column is factorised once and only its distinct values become text:
    ``1`` and ``"1"`` are one name, as ``astype(str)`` would make them.
    """
    codes, uniq = pd.factorize(col, use_na_sentinel=True)
    texts = np.array([*[str(x) for x in uniq], missing], dtype=object)
    names, inverse = np.unique(texts, return_inverse=True)
    return inverse[np.where(codes < 0, len(texts) - 1, codes)], names


def _small_unique(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``np.unique(key, return_inverse=True)`` for small non-negative integers (host x GPU numbers),
    without sorting ten million of them: a table of the values present."""
    if not len(key):
        return key.copy(), np.zeros(0, dtype=np.int64)
    present = np.zeros(int(key.max()) + 1, dtype=bool)
    present[key] = True
    rank = np.cumsum(present, dtype=np.int64) - 1
    return np.nonzero(present)[0].astype(key.dtype), rank[key]


def process_starts(pid: np.ndarray, present: np.ndarray, block: int = 256) -> np.ndarray:
    """Return, per cell of the GPU × time ``pid`` matrix, the column where the GPU's current process started: a
    sample (``present``) showing another PID than the GPU's sample before starts a new one. A cell with no sample
    carries nothing: a scrape missed does not end the process, so the same PID after it is the same process (Linux
    does not hand a PID out again before it has used every other, and a process that lives on through a missed
    scrape is one target, not two: one kill, its freed GPU-hours counted once). Worked ``block`` GPUs at a time."""
    n_rows, n_cols = pid.shape
    start = np.zeros(pid.shape, dtype=np.int32)
    cols = np.arange(n_cols, dtype=np.int32)
    for lo in range(0, n_rows, block):
        p, seen = pid[lo:lo + block], present[lo:lo + block]
        last = np.where(seen, cols, 0).astype(np.int32)
        np.maximum.accumulate(last, axis=1, out=last)  # the latest column with a sample, at or before each
        before = np.take_along_axis(p, last, axis=1)  # the PID that sample showed
        change = np.ones(p.shape, dtype=bool)
        change[:, 1:] = seen[:, 1:] & (p[:, 1:] != before[:, :-1])
        mine = start[lo:lo + block]
        mine[change] = np.broadcast_to(cols, p.shape)[change]
        np.maximum.accumulate(mine, axis=1, out=mine)
    return start


# -- the replay ------------------------------------------------------------------------------
@dataclass
class _Alloc:
    """A job as the replay tracks it: its record, GPU rows and (simulated) end."""

    job: Job
    rows: np.ndarray
    start: float
    end: float  # when the trace says it ended (inf: still running at the trace end)
    killed_at: float | None = None
    #: placed by the jobs file's ``gpu_ids`` (the scheduler's numbering), not by the samples' labels
    claimed: bool = False


@dataclass
class ReplayResult:
    """What a replay found; :meth:`to_dict` is the ``gpu-cost replay --json`` payload."""

    policy: str
    mode: str
    start: float | None = None
    end: float | None = None
    gpus: int = 0
    jobs: int = 0
    sweeps: int = 0
    sample_interval_s: float = 0.0
    gpu_hours: float = 0.0
    allocated_gpu_hours: float = 0.0
    idle_gpu_hours: float | None = 0.0
    #: idle GPU-hours still held at the end (the same measure as ``idle_gpu_hours``, after the simulated kills)
    idle_left_gpu_hours: float | None = None
    reclaimed_gpu_hours: float = 0.0
    actions: list[dict[str, Any]] = field(default_factory=list)
    false_kills: int = 0
    false_kill_targets: list[str] = field(default_factory=list)
    kills: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    approvals_requested: int = 0
    #: every destructive rung that needed a human: ``{ts, target, job_id, rule, action, rung, user, confidence,
    #: kind, asked, answer, reason}`` (``asked``: approver, or owner under ``--approvals owner``)
    human_asked: list[dict[str, Any]] = field(default_factory=list)
    human_asked_count: int = 0
    capped_sweeps: int = 0
    #: destructive actions the rolling caps held back (caps.rolling / caps.entry_points.sweep)
    rolling_capped: int = 0
    degraded_sweeps: int = 0
    notes: list[str] = field(default_factory=list)
    #: the savings ledger as the agent would have booked it: freed, re-used, observed waste on the targets
    ledger: dict[str, Any] = field(default_factory=dict)
    #: GPU-hours reclaimed per kind of job killed: service, training, interactive (ground truth when the trace has it)
    reclaimed_by_kind: dict[str, float] = field(default_factory=dict)
    #: idle GPU-hours measured on the killed targets before the kill, as a share of all idle GPU-hours
    idle_acted_share: float | None = None
    #: with a ground-truth ``behaviour`` column: per behaviour, jobs, found, notified, killed, false kills,
    #: GPU-hours reclaimed by those kills (``reclaimed_gpu_hours``: the text summary prints these, not
    #: ``reclaimed_by_kind``, so "killed" and "reclaimed" count the same jobs), median seconds from the
    #: job's start (a zombie: its job's end; at the earliest the trace's start) to the first notice
    by_behaviour: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("gpu_hours", "allocated_gpu_hours", "reclaimed_gpu_hours"):
            d[k] = round(d[k], 2)
        for k in ("idle_gpu_hours", "idle_left_gpu_hours"):
            if d[k] is not None:
                d[k] = round(d[k], 2)
        d["start"] = iso(self.start) if self.start is not None else None
        d["end"] = iso(self.end) if self.end is not None else None
        d["reclaimed_share_of_idle"] = (round(self.reclaimed_gpu_hours / self.idle_gpu_hours, 3)
                                        if self.idle_gpu_hours else None)
        d["seconds"] = round(self.seconds, 1)
        return d


def replay_files(samples: str | Path | None, jobs: str | Path, policy: Policy, *, mode: str | None = "enforce",
                 approvals: str = "approve", logs: str | Path | None = None, store: Any = None) -> ReplayResult:
    """Read trace files and replay ``policy`` over them (see :func:`replay`).

    :param logs: job log lines (``ts, job_id, stream, line``); default ``logs.csv`` beside ``jobs``
        when it exists.
    """
    holder, jdf, ldf, notes = _read_trace(samples, jobs, logs)
    # the replay drops the samples once they are dense: keep no other reference to them here
    res = replay(holder, jdf, policy, mode=mode, approvals=approvals, logs=ldf, store=store)
    res.notes[:0] = notes
    return res


def _read_trace(samples: str | Path | None, jobs: str | Path, logs: str | Path | None
                ) -> tuple[list[pd.DataFrame] | None, pd.DataFrame, pd.DataFrame | None, list[str]]:
    """Return ``([samples] or None, jobs, logs, notes)`` read from trace files (logs: ``logs.csv`` beside the jobs by default)."""
    jdf = normalise_jobs(read_table(jobs, "jobs"), str(jobs))
    notes = []
    if logs is None and (Path(jobs).parent / "logs.csv").is_file():
        logs = Path(jobs).parent / "logs.csv"
        notes.append(f"job logs read from {logs} (beside the jobs file)")
    ldf = read_logs(logs) if logs else None
    if not samples:
        return None, jdf, ldf, notes
    return [normalise_samples(read_table(samples, "samples", REPLAY_SAMPLE_COLUMNS, categories=TEXT_COLUMNS,
                                         single=("power_w",)),
                              str(samples))], jdf, ldf, notes


#: the dense matrices a replay reads; a simulated kill edits the first five: each replay gets its own copy of those
_MATRICES = ("util", "mem", "job_code", "pid", "power", "times", "hosts", "gpu_idx", "uuids", "mem_total", "models",
             "job_names", "pid_start", "user", "user_names")


@dataclass
class PreparedTrace:
    """A trace read and made dense once, replayed under many policies (``gpu-cost tune``).

    Each :meth:`replay` copies the matrices a simulated kill edits and shares the rest, so N
    replays read and prepare the trace once. ``idle_measure`` (``(util_max %, mem_min MiB)``) measures
    ``idle_gpu_hours`` and ``idle_left_gpu_hours`` of every replay alike (None: each policy's own thresholds).
    """

    jobs: pd.DataFrame
    logs: pd.DataFrame | None
    #: the dense matrices (:data:`_MATRICES`); None: a jobs-only trace
    matrices: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    idle_measure: tuple[float, float] | None = None

    @property
    def empty(self) -> bool:
        return self.matrices is None

    def replay(self, policy: Policy, *, mode: str | None = "enforce", approvals: str = "approve",
               store: Any = None) -> ReplayResult:
        """Replay ``policy`` over the prepared trace (:func:`replay`)."""
        return replay(self, self.jobs, policy, mode=mode, approvals=approvals, logs=self.logs, store=store)


def prepare_files(samples: str | Path | None, jobs: str | Path, logs: str | Path | None = None) -> PreparedTrace:
    """Read trace files once and make them dense, for many replays (:class:`PreparedTrace`)."""
    holder, jdf, ldf, notes = _read_trace(samples, jobs, logs)
    return prepare(holder, jdf, ldf, notes=notes)


def prepare(samples: pd.DataFrame | list[pd.DataFrame] | None, jobs: pd.DataFrame, logs: pd.DataFrame | None = None,
            *, notes: list[str] | None = None) -> PreparedTrace:
    """Make a trace (normalised frames; a one-element list hands the samples over) dense once (:class:`PreparedTrace`)."""
    frame = (samples.pop() if samples else None) if isinstance(samples, list) else samples
    jobs = normalise_jobs(jobs) if "start_ts" in jobs and not pd.api.types.is_float_dtype(jobs["start_ts"]) else jobs
    if frame is None or frame.empty:
        return PreparedTrace(jobs, logs, None, list(notes or []))
    # the matrices are built by the replay's own code, on an engine that is never run
    dense = _Replay.__new__(_Replay)
    dense.res = ReplayResult(policy="", mode="")
    dense._dense(frame, consume=isinstance(samples, list))
    release_arrow_memory()
    times = dense.times
    check_job_clock(jobs, dense._label_spans(), float(times[0]), float(times[-1]),
                    float(np.median(np.diff(times))) if len(times) > 1 else 0.0)
    return PreparedTrace(jobs, logs, {k: getattr(dense, k, None) for k in _MATRICES}, [*(notes or []), *dense.res.notes])


LOG_COLUMNS = ("ts", "job_id", "line")


def read_logs(path: str | Path) -> pd.DataFrame:
    """Read a trace's job log lines (``ts, job_id, [stream,] line``), sorted by time."""
    df = read_table(path, "logs")
    missing = [c for c in LOG_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{path}: job logs need columns {', '.join(LOG_COLUMNS)}; missing {', '.join(missing)}")
    df = df.assign(ts=_epoch_col(df["ts"], str(path), "ts"), job_id=df["job_id"].astype(str),
                   line=df["line"].fillna("").astype(str))
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def replay(samples: pd.DataFrame | list[pd.DataFrame] | PreparedTrace | None, jobs: pd.DataFrame, policy: Policy, *,
           mode: str | None = "enforce", approvals: str = "approve", logs: pd.DataFrame | None = None,
           store: Any = None) -> ReplayResult:
    """Replay ``policy`` over a trace.

    :param samples: trace samples (normalised); None for a jobs-only trace. A one-element list
        hands the frame over: it is emptied once the dense matrices are built, to save memory. A
        :class:`PreparedTrace` is replayed on copies of its matrices.
    :param mode: ``enforce`` (default: as if enforced), ``notify``, ``dry-run``; None keeps the policy's.
    :param approvals: ``approve`` (decisions needing a human are taken as approved), ``reject``, or ``owner``
        (a destructive rung acts only once the target's owner answered "release it now"; none otherwise).
    :param logs: job log lines (``ts, job_id, line``): each sweep reads the lines written by then,
        as the live sweep reads a job's StdOut tail.
    :param store: the audit store the replay's sweeps write to (escalations, decisions, usage,
        baselines); default a throwaway one (:meth:`AuditStore.scratch`). A store given keeps what it held (a verifier
        model, class baselines, outcomes learnt from earlier weeks) and what the replay adds.
    """
    t0 = time.time()
    if approvals not in APPROVALS:
        raise TraceError(f"approvals must be one of {', '.join(APPROVALS)}, got {approvals!r}")
    policy = _with_mode(policy, mode or policy.mode)
    jobs = normalise_jobs(jobs) if "start_ts" in jobs and not pd.api.types.is_float_dtype(jobs["start_ts"]) else jobs
    res = ReplayResult(policy=policy.source, mode=policy.mode, jobs=len(jobs))
    if isinstance(samples, list):
        frame = samples.pop() if samples else None
    else:
        frame = samples
    if frame is None or frame.empty:
        _jobs_only(jobs, res)
        res.seconds = time.time() - t0
        return res
    engine = _Replay(frame, jobs, policy, approvals, res, logs, consume=isinstance(samples, list))
    engine.store = store
    del frame
    engine.run()
    res.seconds = time.time() - t0
    logger.info("replay: %d sweeps over %d GPUs in %.1fs: %d kills (%d false), %.1f GPU-h reclaimed", res.sweeps,
                res.gpus, res.seconds, res.kills, res.false_kills, res.reclaimed_gpu_hours)
    return res


def _with_mode(policy: Policy, mode: str) -> Policy:
    if mode not in ("dry-run", "notify", "enforce"):
        raise TraceError(f"mode must be dry-run, notify or enforce, got {mode!r}")
    new = dataclasses.replace(policy, mode=mode)  # type: ignore[arg-type]
    object.__setattr__(new, "source", policy.source)
    return new


def _jobs_only(jobs: pd.DataFrame, res: ReplayResult) -> None:
    start = jobs["start_ts"].to_numpy(dtype=float)
    end = jobs["end_ts"].to_numpy(dtype=float) if "end_ts" in jobs else np.full(len(jobs), np.nan)
    gpus = pd.to_numeric(jobs["gpus"], errors="coerce").fillna(0).to_numpy(dtype=float) if "gpus" in jobs else \
        np.zeros(len(jobs))
    ok = ~np.isnan(start) & ~np.isnan(end) & (end >= start)
    res.allocated_gpu_hours = float(np.sum(gpus[ok] * (end[ok] - start[ok])) / 3600.0)
    res.gpu_hours = res.allocated_gpu_hours
    res.idle_gpu_hours = None
    if ok.any():
        res.start, res.end = float(np.min(start[ok])), float(np.max(end[ok]))
    res.notes.append(JOBS_ONLY_NOTE)
    if "gpus" not in jobs:
        res.notes.append("the jobs have no gpus column: allocated GPU-hours count as 0")


class _Replay:
    """The simulation loop; state is the dense matrices (edited by simulated kills) and an audit store."""

    def __init__(self, samples: pd.DataFrame | PreparedTrace, jobs: pd.DataFrame, policy: Policy, approvals: str,
                 res: ReplayResult, logs: pd.DataFrame | None = None, *, consume: bool = False) -> None:
        self.res = res
        self.approvals = approvals
        #: job id -> (times, lines, the log's size after each line) of its log, sorted: a sweep at t reads the
        #: lines written by t
        self.logs: dict[str, tuple[np.ndarray, list[str], np.ndarray]] = {}
        if logs is not None and len(logs):
            for jid, part in logs.groupby("job_id", sort=False):
                lines = part["line"].tolist()
                sizes = np.cumsum([len(x) + 1 for x in lines], dtype=np.int64)
                self.logs[str(jid)] = (part["ts"].to_numpy(dtype=float), lines, sizes)
        #: job id -> ground-truth behaviour, when the trace has one (a simulated trace's ``behaviour``)
        self.truth: dict[str, str] = ({str(j): str(b) for j, b in zip(jobs["job_id"], jobs["behaviour"], strict=True)
                                       if b == b and b} if "behaviour" in jobs.columns else {})
        #: target -> (first finding ts, first notice ts)
        self.first_seen: dict[str, float] = {}
        self.first_notice: dict[str, float] = {}
        #: process target -> the job its process belonged to
        self._proc_job: dict[str, str] = {}
        #: decision id -> its entry in ``res.human_asked`` (a request is listed once)
        self._asked_at: dict[str, dict[str, Any]] = {}
        #: decision id -> idle GPU-hours measured on its target before the kill
        self.waste_seen: dict[str, float] = {}
        #: decision id -> what its kill did in the trace (:meth:`_kill`), until the action is listed
        self.killed: dict[str, dict[str, Any]] = {}
        #: the audit store to replay into (None: a throwaway one)
        self.store: Any = None
        #: (util_max %, mem_min MiB) measuring idle GPU-hours; None: the policy's idle_allocation / zombie thresholds
        self.idle_measure: tuple[float, float] | None = None
        if isinstance(samples, PreparedTrace):
            self._adopt(samples)
        else:
            self._dense(samples, consume)
        if consume:
            release_arrow_memory()  # the last columns dropped
        self._scheduler_names(jobs)
        times = self.times
        self.row_of = {(h, int(g)): i for i, (h, g) in enumerate(zip(self.hosts, self.gpu_idx, strict=True))}
        self.dt = float(np.median(np.diff(times))) if len(times) > 1 else float(policy.sweep.sample_interval)
        if abs(self.dt - policy.sweep.sample_interval) > 1e-6:
            res.notes.append(f"the trace samples every {self.dt:g}s; replayed with sweep.sample_interval={self.dt:g}s "
                             f"instead of the policy's {policy.sweep.sample_interval:g}s")
            sweep_cfg = dataclasses.replace(policy.sweep, sample_interval=self.dt)
            src = policy.source
            policy = dataclasses.replace(policy, sweep=sweep_cfg)
            object.__setattr__(policy, "source", src)
        self.policy = policy
        spans = self._label_spans()
        if not isinstance(samples, PreparedTrace):  # a prepared trace was checked once, for all its replays
            check_job_clock(jobs, spans, float(times[0]), float(times[-1]), self.dt)
        jobs, moved = labelled_starts(jobs, spans, float(times[0]), self.dt)
        if moved:
            res.notes.append(moved)
        del spans
        #: host -> its sampled GPU indices; the jobs' gpu_ids that name a sampled node's GPU no sample shows
        self.host_gpus: dict[str, set[int]] = {}
        for h, g in self.row_of:
            self.host_gpus.setdefault(str(h), set()).add(g)
        self.unsampled: set[tuple[str, int]] = set()
        self.allocs = self._allocs(jobs)
        #: the GPU rows of hosts where no sample carries a job label: there a process's job is the jobs file's word
        #: alone (:meth:`_procs_at`); an exporter that labels its GPUs says "no job" by an empty label
        labelled = {str(self.hosts[r]) for r in np.flatnonzero((self.job_code != 0).any(axis=1))}
        self.unlabelled = np.array([str(h) not in labelled for h in self.hosts.tolist()], dtype=bool)
        self._holders: dict[int, list[tuple[float, float, str]]] | None = None
        #: (row, pid, first seen) of the processes no job of the jobs file held the GPU of when they started
        self.unknown_procs: set[tuple[int, int, float]] = set()
        if self.unsampled:
            host, _ = min(self.unsampled)
            names = sorted(i for h, i in self.unsampled if h == host)
            res.notes.append(
                f"the jobs' gpu_ids name {len(self.unsampled)} GPU(s) of sampled nodes that no sample shows ({host}: "
                f"{some([str(i) for i in names], 4)}; its samples number "
                f"{', '.join(map(str, sorted(self.host_gpus[host])[:8]))}): no GPU of the samples is those jobs' there. "
                "If the exporter numbers GPUs otherwise than Slurm (from 1, or by another order), write Slurm's index "
                "in the gpu column")
        #: the hosts the scheduler runs jobs on (named by the jobs file, or holding a job's GPUs by its labels): a
        #: sampled host outside them is outside the scheduler (correlate.attribute); None: the file names no node
        self.managed = managed_hosts(self.named, (str(self.hosts[r]) for a in self.allocs.values() for r in a.rows))
        outside = sorted(set(self.hosts.tolist()) - self.managed) if self.managed is not None else []
        if outside:
            res.notes.append(
                f"{len(outside)} sampled host(s) no job of the jobs file names ({some(outside, 3)}): taken as outside "
                "the scheduler (an inference server, a workstation the same Prometheus scrapes), their GPUs judged by "
                "no rule and their processes no zombies")
        #: hosts whose GPU numbering the samples contradict (:func:`gpu_cost.perceive.gpu_map.trace_numbering`):
        #: their GPUs are read as stale, judged by no rule
        self.doubtful = self._numbering()
        #: job id -> its runs' keys in ``allocs`` (a requeued job's runs share an id)
        self.runs: dict[str, list[str]] = {}
        for key, a in self.allocs.items():
            self.runs.setdefault(a.job.job_id, []).append(key)
        if jobs.attrs.get("repeated_rows"):
            res.notes.append(f"{jobs.attrs['repeated_rows']} job row(s) repeat another row's job and start (exports "
                             "over overlapping spans): each job is read once, with its latest known end")
        if jobs.attrs.get("runs_cut"):
            res.notes.append(f"{jobs.attrs['runs_cut']} run(s) of a requeued job overlap the job's next run (an end "
                             "not known, or later): each is read as ended when the next started")
        #: the jobs file's job ids: a GPU labelled with another job is nobody's (correlate.attribute's ``recorded``)
        self.recorded = frozenset(jobs["job_id"].astype(str))
        unrecorded = sorted(set(self.job_names[1:].tolist()) - self.recorded)
        if unrecorded:
            shown = some(unrecorded, 3)
            res.notes.append(f"{len(unrecorded)} job(s) the samples label are not in the jobs file ({shown}): their GPUs "
                             "are judged by no rule while so labelled (nothing says those jobs ended); export the jobs "
                             "over the samples' whole span")
        unplaced = [a.job for a in self.allocs.values() if a.job.unplaced_gpus]
        sampled = set(self.hosts.tolist())
        # a job only on nodes no sample shows is the note on uncovered nodes' (run)
        bare = sum(1 for j in unplaced if not j.gpu_alloc and (not j.nodes or set(j.nodes) & sampled))
        if bare:
            res.notes.append(f"{bare} job(s) hold GPUs the trace does not place (no gpu_ids, no sample labelled "
                             "with them): no rule judges those GPUs, and no GPU on their nodes is taken for a zombie")
        short = [j for j in unplaced if j.gpu_alloc]
        if short:
            j = short[0]
            placed = sum(len(idx) for _, idx in j.gpu_alloc)
            res.notes.append(
                f"{len(short)} job(s) count more GPUs in their gpus column than their gpu_ids or labels place (job "
                f"{j.job_id}: gpus {j.gpus_requested}, placed {placed}): the rest are judged by no rule, and no GPU on "
                "their nodes is taken for a zombie. If the column is in another unit (a percentage of a GPU, as some "
                "schedulers' plans write it), write GPU counts")
        res.gpus, res.start, res.end, res.sample_interval_s = len(self._ours()), float(times[0]), float(times[-1]), self.dt
        self._totals()

    # -- set-up ------------------------------------------------------------------------------
    def _dense(self, s: pd.DataFrame, consume: bool = False) -> None:
        """Make the GPU x time matrices once (what :func:`gpu_cost.perceive.aggregate.to_dense` does, without copying the frame).

        Strings (job ids, users) become integer codes into small name tables, so a 10 M-row
        trace costs a few hundred MB, not gigabytes of Python strings. ``consume``: the frame was
        handed over, and each column is dropped from it once it is in its matrix (a week's column
        is 80 MB: they need not all be held beside the matrices).
        """
        from gpu_cost.perceive.aggregate import (
            check_one_sample_per_cell,
            clean,
            coarse_step,
            held_cells,
            sample_steps,
            slow_note,
        )

        def take(col: str) -> pd.Series:
            values = s[col]
            if consume:
                del s[col]
                release_arrow_memory()  # the columns dropped before this one
            return values

        host_codes, host_names = _text_codes(take("host"), "nan")
        gpu = take("gpu").to_numpy(dtype=np.int64)
        width = int(gpu.max()) + 1 if len(gpu) else 1
        key = host_codes.astype(np.int64) * width + gpu
        del host_codes, gpu
        ukeys, rows = _small_unique(key)
        del key
        ts = take("ts").to_numpy(dtype=float)
        times, cols, keep, step = sample_steps(ts, rows)
        coarse = coarse_step(times, len(ukeys))
        if coarse is not None:
            self.res.notes.append(f"the trace has {len(times)} sample times for {len(ukeys)} GPUs: read at a {coarse:g}s "
                                  "step (each GPU's latest sample of the step, as an exporter scraped at that step reads "
                                  "it), so that its matrices fit in memory")
            times, cols, keep, step = sample_steps(ts, rows, coarse)
        del ts
        if step is not None and coarse is None:
            dropped = f"; of {len(keep) - int(keep.sum())} pairs on one step the later kept" if keep is not None else ""
            self.res.notes.append(f"the GPUs' sample times do not line up (each host on its own clock, or jitter): "
                                  f"each sample is read at the nearest whole {step:g}s step{dropped}")
        self.times = times
        self.hosts = np.asarray(host_names, dtype=object)[ukeys // width]
        self.gpu_idx = (ukeys % width).astype(np.int64)
        n_g = len(ukeys)
        self.uuids = np.full(n_g, "", dtype=object)
        self.mem_total = np.full(n_g, np.nan)
        self.models = np.full(n_g, "", dtype=object)
        if "model" in s.columns:
            mc, mn = _text_codes(take("model"))
            self.models[rows] = mn[mc]
            del mc
        shape = (n_g, len(times))
        # one flat index into the matrices instead of a row and a column index per sample
        flat = rows.astype(np.int64) * shape[1] + cols
        del rows, cols
        if keep is not None:
            flat = flat[keep]
        # a GPU sampled at a slower step than the trace's: each sample stands until its next (as a range query reads it)
        held, held_src, slow = held_cells(flat, n_g, times)
        if slow:
            self.res.notes.append(slow_note(slow, times))

        def fill(values: np.ndarray, dtype: Any = float, default: Any = np.nan) -> np.ndarray:
            out = np.full(shape, default, dtype=dtype)
            kept = values if keep is None else values[keep]
            out.ravel()[flat] = kept
            out.ravel()[held] = kept[held_src]
            return out

        util = pd.to_numeric(take("util"), errors="coerce").to_numpy(dtype=float)
        mem = pd.to_numeric(take("mem_used_mib"), errors="coerce").to_numpy(dtype=float)
        check_one_sample_per_cell(
            flat, shape[0] * shape[1], util if keep is None else util[keep], mem if keep is None else mem[keep],
            lambda i: f"{self.hosts[flat[i] // shape[1]]} GPU {self.gpu_idx[flat[i] // shape[1]]} at "
                      f"{iso(float(times[flat[i] % shape[1]]))}")
        if len(mem) and np.isnan(mem).all():
            from gpu_cost.perceive.snapshot import MEMORY_NOT_MEASURED

            self.res.notes.append(f"the samples measure no GPU memory (mem_used_mib empty): {MEMORY_NOT_MEASURED}")
        self.util, self.mem = clean(fill(util), fill(mem))
        del util, mem
        self.power = None
        if "power_w" in s.columns:
            # read as a live sweep reads DCGM's (a draw over an idle GPU's is progress); single precision: a week of
            # 1,000 GPUs is 40 MB, not 80, and a watt needs no more
            watts = pd.to_numeric(take("power_w"), errors="coerce").to_numpy(dtype=np.float32)
            if not np.isnan(watts).all():
                self.power = fill(watts, np.float32)
            del watts
        self.job_names = np.array([""], dtype=object)
        if "job_id" in s.columns:
            # the names are sorted and always hold the missing label "": it is code 0, as unlabelled cells
            jc, self.job_names = _text_codes(take("job_id"))
            self.job_code = fill(jc.astype(np.int32), np.int32, 0)
            del jc
        else:
            self.job_code = np.zeros(shape, dtype=np.int32)
        self.pid = self.pid_start = self.user = None
        if "pid" not in s.columns:
            self.res.notes.append("the samples have no pid column: zombie GPUs can be reported, not killed "
                                  "(a process kill needs the process)")
            return
        pids = pd.to_numeric(take("pid"), errors="coerce").fillna(0).to_numpy(dtype=np.int64)
        # process ids fit 32 bits on Linux (pid_max is at most 2^22): half the memory of a week's matrix
        small = not len(pids) or (int(pids.min()) >= np.iinfo(np.int32).min and int(pids.max()) <= np.iinfo(np.int32).max)
        pid = fill(pids.astype(np.int32) if small else pids, np.int32 if small else np.int64, 0)
        del pids
        present = np.zeros(shape, dtype=bool)
        present.ravel()[flat] = True
        present.ravel()[held] = True
        self.pid, self.pid_start = pid, process_starts(pid, present)
        del present
        if "user" in s.columns:
            uc, un = _text_codes(take("user"))
            self.user = fill(uc.astype(np.int32), np.int32, -1)
            self.user_names = np.array([*un, ""], dtype=object)
            del uc

    def _scheduler_names(self, jobs: pd.DataFrame) -> None:
        """Read each sampled host the jobs (``gpu_ids``, ``nodes``) name otherwise (``gpu01`` for
        ``gpu01.cluster.example.org``, ``gpu01:9400``) under the jobs' name
        (:func:`gpu_cost.perceive.correlate.host_names`): a new array, a prepared trace's is shared."""
        from gpu_cost.perceive.correlate import aliases, host_names
        from gpu_cost.perceive.trace import named_hosts

        names = self.named = named_hosts(jobs)
        renamed = host_names(set(self.hosts.tolist()), names)
        if renamed:
            self.hosts = np.array([renamed.get(h, h) for h in self.hosts.tolist()], dtype=object)
            shown = some([f"{a} as {b}" for a, b in sorted(renamed.items())], 3)
            self.res.notes.append(f"{len(renamed)} sampled host(s) read under the name the jobs give them: {shown}")
        second = sorted(aliases(set(self.hosts.tolist()), names))
        if second:
            self.res.notes.append(
                f"{len(second)} sampled host(s) are a second name of a node the samples also name, or a name of two "
                f"({some(second, 3)}): their GPUs may be that node's jobs', "
                "so they are judged by no rule; name each node one way in the samples")

    def _adopt(self, prepared: PreparedTrace) -> None:
        """Take a prepared trace's matrices: a copy of those a simulated kill edits, the others shared."""
        assert prepared.matrices is not None
        for k in _MATRICES:
            value = prepared.matrices[k]
            setattr(self, k, value.copy() if k in _MATRICES[:5] and value is not None else value)
        self.res.notes.extend(prepared.notes)
        self.idle_measure = prepared.idle_measure

    def _labels(self, rows: Any, cols: Any) -> np.ndarray:
        """Return the job labels of these cells (``""``: none), as the samples gave them."""
        return self.job_names[self.job_code[rows, cols]]

    def _allocs(self, jobs: pd.DataFrame) -> dict[str, _Alloc]:
        by_label = self._rows_by_label()
        t_end = float(self.times[-1])
        out: dict[str, _Alloc] = {}
        recs: dict[str, Mapping[str, Any]] = {}
        runs: dict[str, int] = {}
        cols = set(jobs.columns)
        for rec in jobs.to_dict("records"):
            jid = str(rec["job_id"])
            start = rec.get("start_ts")
            if start is None or start != start:
                continue
            end = rec.get("end_ts")
            end = math.inf if end is None or end != end else float(end)
            if end < self.times[0] or start > t_end:
                continue
            rows = self._rows_of_ids(rec.get("gpu_ids", "")) if "gpu_ids" in cols else np.zeros(0, dtype=np.int64)
            claimed = bool(len(rows))
            if not claimed:
                rows = by_label.get(jid, np.zeros(0, dtype=np.int64))
            alloc: dict[str, list[int]] = {}
            for r in rows:
                alloc.setdefault(str(self.hosts[r]), []).append(int(self.gpu_idx[r]))
            job = trace_job(rec, alloc, batch=_flag(rec.get("batch")))
            # a requeued job is in the trace once per run, under one id: each run is its own
            runs[jid] = runs.get(jid, 0) + 1
            key = jid if runs[jid] == 1 else f"{jid}#{runs[jid]}"
            out[key] = _Alloc(job, np.sort(rows), float(start), end, claimed=claimed)
            recs[key] = rec
        if any(a.job.unplaced_gpus for a in out.values()):
            # a job the trace does not place that takes whole nodes holds their GPUs (trace.whole_nodes)
            node_gpus: dict[str, list[int]] = {}
            for h, g in zip(self.hosts.tolist(), self.gpu_idx.tolist(), strict=True):
                node_gpus.setdefault(str(h), []).append(int(g))
            held = [(jid, a.start, a.end, a.job.nodes, a.job.gpus_requested, dict(a.job.gpu_alloc))
                    for jid, a in out.items()]
            for jid, alloc in whole_nodes(held, node_gpus).items():
                rows = np.sort(np.array([self.row_of[(h, i)] for h, idx in alloc.items() for i in idx], dtype=np.int64))
                out[jid].job = trace_job(recs[jid], alloc, batch=_flag(recs[jid].get("batch")))
                out[jid].rows = rows
        return out

    def _numbering(self) -> frozenset[str]:
        """Return the hosts whose samples agree with the jobs file's ``gpu_ids`` only when renumbered
        (:func:`gpu_cost.perceive.gpu_map.trace_claims`), with a note."""
        from gpu_cost.perceive.gpu_map import numbering_note, trace_claims

        #: a renumbered node's GPU rows: the jobs file's -> the samples' (figures only)
        self.renumbered: dict[int, int] = {}
        claims = [(a.rows, a.start, a.end) for a in self.allocs.values() if a.claimed]
        if not claims:
            return frozenset()
        found = trace_claims(self.hosts.tolist(), self.gpu_idx.tolist(), self.times, self.util, ~self.unlabelled,
                             claims, self.policy.sweep.busy_util, self.dt)
        if found:
            self.res.notes.append(numbering_note(found))
            # the figures (GPU-hours held) read a job's GPUs there where the renumbering found puts them: the best
            # guess, and no rule acts on it
            self.renumbered = {self.row_of[(h, s)]: self.row_of[(h, e)] for h, moves in found.items()
                               for e, s in moves.items() if (h, s) in self.row_of and (h, e) in self.row_of}
        return frozenset(found)

    def _label_spans(self) -> dict[str, tuple[float, float]]:
        """Return, per job label, the first and last sample time that carries it (a block of GPUs at a time: a
        label holds a GPU for a run of samples, so only the runs' edges are read)."""
        n_codes = len(self.job_names)
        first = np.full(n_codes, np.iinfo(np.int64).max)
        last = np.full(n_codes, -1)
        for lo in range(0, self.job_code.shape[0], 64):
            b = self.job_code[lo:lo + 64]
            starts = b != 0
            starts[:, 1:] &= b[:, 1:] != b[:, :-1]
            ends = b != 0
            ends[:, :-1] &= b[:, :-1] != b[:, 1:]
            r, c = np.nonzero(starts)
            np.minimum.at(first, b[r, c], c)
            r, c = np.nonzero(ends)
            np.maximum.at(last, b[r, c], c)
        return {str(self.job_names[k]): (float(self.times[first[k]]), float(self.times[last[k]]))
                for k in np.flatnonzero(last >= 0) if k}

    def _rows_by_label(self) -> dict[str, np.ndarray]:
        """Return job id → GPU rows whose samples carry that job label."""
        out: dict[str, list[int]] = {}
        for r in range(self.job_code.shape[0]):
            for code in np.unique(self.job_code[r]):
                if code:
                    out.setdefault(str(self.job_names[code]), []).append(r)
        return {name: np.array(v, dtype=np.int64) for name, v in out.items()}

    def _rows_of_ids(self, text: Any) -> np.ndarray:
        from gpu_cost.perceive.trace import parse_gpu_ids

        keys = parse_gpu_ids(text)
        for k in keys:
            if k not in self.row_of and k[0] in self.host_gpus:
                self.unsampled.add(k)  # a sampled node's GPU no sample shows: numbered otherwise?
        return np.array([self.row_of[k] for k in keys if k in self.row_of], dtype=np.int64)

    def _totals(self) -> None:
        ours = self._ours()
        rows: Any = slice(None) if len(ours) == len(self.util) else ours  # every row: no copy of a matrix
        h = self.dt / 3600.0
        self.res.gpu_hours = float(np.count_nonzero(~np.isnan(self.util[rows])) * h)
        mine = set(ours.tolist())
        by_file = self._held_by_file()
        self.res.allocated_gpu_hours = h * float(np.count_nonzero(self.job_code[rows] != 0) + sum(
            int(np.count_nonzero(~np.isnan(self.util[r, self._cols(spans)])))
            for r, spans in by_file.items() if r in mine))
        self.res.idle_gpu_hours = self._idle_hours(by_file)

    def _held_by_file(self) -> dict[int, list[tuple[int, int]]]:
        """Return, per GPU row of a host whose samples carry no job label, the column spans ``[from, to)`` a job of
        the jobs file held it (until its simulated kill). There the jobs file alone says a GPU is held: counted by
        the labels only, an unlabelled trace (an exporter without job labels) held nothing, and its idle-held
        GPU-hours were those holding memory alone."""
        out: dict[int, list[tuple[int, int]]] = {}
        if not self.unlabelled.any():
            return out
        n = len(self.times)
        for a in self.allocs.values():
            rows = a.rows[self.unlabelled[a.rows]] if len(a.rows) else a.rows
            if not len(rows):
                continue
            c0 = int(np.searchsorted(self.times, a.start, side="left"))
            c1 = n if a.end == math.inf else int(np.searchsorted(self.times, a.end, side="left"))
            if a.killed_at is not None:  # a kill frees the GPUs from the next sample on (_kill)
                c1 = min(c1, int(np.searchsorted(self.times, a.killed_at, side="right")))
            if c1 > c0:
                for r in rows.tolist():
                    out.setdefault(self.renumbered.get(int(r), int(r)), []).append((c0, c1))
        return out

    def _cols(self, spans: Sequence[tuple[int, int]]) -> np.ndarray:
        """Return a row's columns within ``spans`` (which may overlap) as a mask over the trace's times."""
        mask = np.zeros(len(self.times), dtype=bool)
        for c0, c1 in spans:
            mask[c0:c1] = True
        return mask

    def _ours(self) -> np.ndarray:
        """Return the rows of the scheduler's GPUs: not those of a host no job of the jobs file names (outside it:
        :func:`gpu_cost.perceive.correlate.attribute`), whose hours are not the cluster's."""
        managed = getattr(self, "managed", None)
        if managed is None:
            return np.arange(len(self.util))
        return np.flatnonzero(np.isin(self.hosts, np.array(sorted(managed), dtype=object)))

    def _idle_hours(self, by_file: Mapping[int, Sequence[tuple[int, int]]] | None = None) -> float:
        """Return the GPU-hours held (by a job, or memory above the zombie floor) while idle, in the matrices now."""
        p = self.policy
        util_max, mem_min = self.idle_measure or (p.rules.idle_allocation.util_max, p.rules.zombie.mem_min_mib)
        # a block of GPUs at a time, and no float copy of a matrix (a week of 1,000 GPUs: 80 MB each): a
        # missing sample (NaN) is neither above the memory floor nor under the utilisation bound
        n = 0
        ours = self._ours()
        whole = len(ours) == len(self.util)  # every row: blocks as slices, no copies
        by_file = self._held_by_file() if by_file is None else by_file
        for lo in range(0, len(ours), 64):
            rows: Any = slice(lo, lo + 64) if whole else ours[lo:lo + 64]
            held = (self.job_code[rows] != 0) | (self.mem[rows] > mem_min)
            for i, r in enumerate(ours[lo:lo + 64].tolist()):
                if r in by_file:
                    held[i] |= self._cols(by_file[r])
            n += int(np.count_nonzero(held & (self.util[rows] < util_max)))
        return float(n * self.dt / 3600.0)

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        from gpu_cost.act import dispatch
        from gpu_cost.analyse import baselines
        from gpu_cost.analyse.rules import run_rules
        from gpu_cost.audit.store import AuditStore
        from gpu_cost.loop import sweep
        from gpu_cost.perceive.correlate import uncovered, uncovered_note, unseen_nodes
        from gpu_cost.perceive.snapshot import from_matrix, rule_windows
        from gpu_cost.report.usage import record_usage

        p = self.policy
        store = (self.store or AuditStore.scratch()).ensure_schema()
        primary, others = rule_windows(p)
        # the first sweep once the short windows are filled; a rule with a longer one (sessions: 2 h) reads
        # its window as stale until then, and stale is never idle
        first = float(self.times[0]) + max(w for w in [primary, *others, p.rules.idle_allocation.window]
                                           if w <= FIRST_SWEEP_MAX_WAIT or w == primary)
        step = p.sweep.interval
        t = math.ceil(first / step) * step
        last = float(self.times[-1])
        lookback = p.sweep.lookback
        self.host_set = set(self.hosts.tolist())
        self.unseen: set[str] = set()
        self.unseen_sweeps = 0
        #: the samples cover part of the cluster (every sampled host one the jobs name): nodes they never show; asked
        #: each sweep only when some job of the file names a node no sample shows
        part = uncovered(self.host_set, self.managed) and any(
            h not in self.host_set for a in self.allocs.values() for h in (*a.job.nodes, *(x for x, _ in a.job.gpu_alloc)))
        self.not_covered: set[str] = set()
        from gpu_cost.perceive.aggregate import RollingWindows

        # the lookback slides along the trace: its sums run along it once, each sweep reads them
        self.rolling = RollingWindows(self.times, self.util, self.mem, p.sweep.busy_util, power=self.power)
        starts = np.array([a.start for a in self.allocs.values()])
        ends = np.array([a.end for a in self.allocs.values()])
        alloc_list = list(self.allocs.values())
        # every action is carried out on the trace while the replay runs (the real executors are back after it)
        with dispatch.simulated_executors(_TraceEffects(self)):
            while t <= last + 1e-6:
                lo = int(np.searchsorted(self.times, t - lookback, side="right"))
                hi = int(np.searchsorted(self.times, t, side="right"))
                live = np.nonzero((starts <= t) & (ends > t))[0]
                jobs = [alloc_list[i].job for i in live if (alloc_list[i].killed_at or math.inf) > t]
                running = {j.job_id for j in jobs}
                snap = from_matrix(
                    policy=p, now=t, source="replay", hosts=self.hosts, gpus=self.gpu_idx, uuids=self.uuids,
                    models=self.models, mem_total=self.mem_total, times=self.times[lo:hi], util=self.util[:, lo:hi],
                    mem=self.mem[:, lo:hi], power=None,  # the running sums read the trace's power
                    job=self._labels(slice(None), slice(max(lo, hi - 1), hi)), jobs=jobs,
                    processes=self._procs_at(hi - 1, running) if hi > lo else [], nodes=(), rolling=self.rolling,
                    recorded=self.recorded, managed=self.managed, doubtful=self.doubtful,
                )
                if snap.degraded:
                    self.res.degraded_sweeps += 1
                    unseen = unseen_nodes(self.host_set, jobs)
                    if unseen:
                        self.unseen_sweeps += 1
                        self.unseen.update(unseen)
                elif part:
                    self.not_covered.update(unseen_nodes(self.host_set, jobs))
                run_id = f"replay:{int(t)}"
                snap.job_logs = self._logs_at(snap, t)
                baselines.observe(store, snap, p, run_id=run_id)  # learnt from the trace up to t, never after
                findings = run_rules(snap, p)
                for f in findings:
                    if f.target not in self.first_seen:
                        self.first_seen[f.target] = t
                        if f.target_kind == "process":
                            self._proc_job[f.target] = self._job_of_process(f.job_id, f.gpu_ids, t)
                plan = sweep.plan(findings, snap, p, store, t, predicted_end={})
                sweep.record(plan, store, run_id, t)
                record_usage(store, snap, p, run_id=run_id)
                for d in plan.decisions:
                    self.res.decisions[d.action] = self.res.decisions.get(d.action, 0) + 1
                if plan.cap_violation:
                    self.res.capped_sweeps += 1
                else:
                    self._act(plan.decisions, store, t, snap.gpu_count(), run_id)
                self.res.sweeps += 1
                t += step
        if self.unseen:
            shown = some(sorted(self.unseen), 5)
            self.res.notes.append(
                f"{self.unseen_sweeps} sweep(s) degraded: running jobs hold GPUs on node(s) no sample names ({shown}), "
                "so nothing destructive acted in them, and no GPU on a host the jobs do not name was taken for a "
                "zombie; if the samples name those nodes otherwise (an IP address), write the scheduler's names "
                "in their host column")
        if self.not_covered:
            self.res.notes.append(uncovered_note(sorted(self.not_covered)))
        if self.unknown_procs:
            shown = some(sorted({f"{self.hosts[r]}:{pid}" for r, pid, _ in self.unknown_procs}), 3)
            self.res.notes.append(
                f"{len(self.unknown_procs)} process(es) started on a GPU no job of the jobs file held then ({shown}), "
                "and no sample labels them with a job: their job is "
                "unknown, so they were reported, never killed (a jobs file exported by state, sacct -s CD, leaves out "
                "the jobs that were running; export every state over the samples' span)")
        del self.rolling  # its running sums (five GPU x time arrays) are the sweeps' alone: not held while the ledger reads
        self._ledger(store, last)
        self._outcomes()
        self.res.idle_left_gpu_hours = self._idle_hours()

    def _ledger(self, store: Any, until: float) -> None:
        """Fill ``res.ledger`` from the savings the kills booked (the report's own functions)."""
        from gpu_cost.report.ledger import reused

        rows = store.query("SELECT * FROM gpu_cost_savings ORDER BY ts")
        by_saving = reused(store, rows, until + self.policy.sweep.interval)
        targets = []
        for r in rows:
            sid = str(r["saving_id"])
            targets.append({"saving_id": sid, "target": r["target"], "freed_gpu_hours": round(float(r["gpu_hours"]), 4),
                            "reused_gpu_hours": round(by_saving.get(sid, 0.0), 4),
                            "observed_waste_gpu_hours": round(self.waste_seen.get(str(r["decision_id"]), 0.0), 4),
                            "basis": r["basis"]})
        self.res.ledger = {
            "freed_gpu_hours": round(sum(x["freed_gpu_hours"] for x in targets), 2),
            "reused_gpu_hours": round(sum(x["reused_gpu_hours"] for x in targets), 2),
            "observed_waste_gpu_hours": round(sum(x["observed_waste_gpu_hours"] for x in targets), 2),
            "freed_usd": round(sum(float(r["usd"] or 0.0) for r in rows), 2),
            "savings": len(targets), "targets": targets,
        }

    def _logs_at(self, snap: Any, t: float) -> dict[str, dict[str, Any]]:
        """Return the log tails a live sweep at ``t`` would have read (the same candidates, the same bound)."""
        from gpu_cost.analyse.evidence import tail_lines
        from gpu_cost.perceive.live import log_candidates

        if not self.logs:
            return {}
        cfg = self.policy.evidence.job_log
        out = {}
        for job in log_candidates(snap, self.policy):
            found = self.logs.get(job.job_id)
            if found is None:
                continue
            times, lines, sizes = found
            n = int(np.searchsorted(times, t, side="right"))
            text = tail_lines(lines[max(0, n - 400):n], cfg.max_bytes)
            out[job.job_id] = {"path": f"slurm-{job.job_id}.out", "text": text,
                               "size": int(sizes[n - 1]) if n else 0, "mtime": float(times[n - 1]) if n else None}
        return out

    def _outcomes(self) -> None:
        """Sum up, per kind of job, what was reclaimed and how soon the owners were told."""
        by_kind: dict[str, float] = {}
        for a in self.res.actions:
            if a.get("freed_gpu_hours") is None:
                continue
            kind = self._kind(a)
            by_kind[kind] = round(by_kind.get(kind, 0.0) + float(a["freed_gpu_hours"]), 3)
        self.res.reclaimed_by_kind = by_kind
        if self.res.idle_gpu_hours:
            self.res.idle_acted_share = round(sum(self.waste_seen.values()) / self.res.idle_gpu_hours, 3)
        if not self.truth:
            return
        out: dict[str, dict[str, Any]] = {}
        # job id -> the targets found that were it or one of its processes, in the order they were first found
        # (one pass: a week has thousands of jobs and of targets)
        found_of: dict[str, list[str]] = {}
        for t in self.first_seen:
            for jid in {t[len("job:"):] if t.startswith("job:") else None, self._proc_job.get(t)} - {None}:
                found_of.setdefault(str(jid), []).append(t)
        for jid, beh in sorted(self.truth.items()):
            alloc = self.allocs.get(jid)
            if alloc is None:
                continue
            row = out.setdefault(beh, {"jobs": 0, "found": 0, "notified": 0, "killed": 0, "false_kills": 0,
                                       "first_notice_after_start_s": []})
            row["jobs"] += 1
            targets = found_of.get(jid, [])
            if targets:
                row["found"] += 1
            notices = [self.first_notice[t] for t in targets if t in self.first_notice]
            if notices:
                row["notified"] += 1
                zombie = any(t.startswith("proc:") for t in targets) and alloc.end != math.inf
                ref = alloc.end if zombie else alloc.start
                row["first_notice_after_start_s"].append(min(notices) - max(ref, float(self.times[0])))
        for row in out.values():
            row["reclaimed_gpu_hours"] = 0.0
        for act in self.res.actions:
            job_of = act.get("job_id") or self._proc_job.get(str(act["target"]), "")
            truth = self.truth.get(str(job_of))
            if act["action"] in KILL_ACTIONS and truth in out:
                out[str(truth)]["killed"] += 1
                out[str(truth)]["false_kills"] += int(bool(act.get("false_kill")))
            if act.get("freed_gpu_hours") is not None and truth in out:
                # the kill's GPU time counts for the behaviour of the job it ended (an idle job, a zombie's):
                # the same jobs the row's "killed" counts, one definition for both
                row = out[str(truth)]
                row["reclaimed_gpu_hours"] = round(row["reclaimed_gpu_hours"] + float(act["freed_gpu_hours"]), 3)
        for row in out.values():
            delays = row.pop("first_notice_after_start_s")
            row["median_first_notice_s"] = round(float(np.median(delays))) if delays else None
        self.res.by_behaviour = out

    def _job_of_process(self, job_id: str | None, gpu_ids: Any, t: float) -> str:
        """Return the job label the process's GPU carried when the process was last seen (its job's id)."""
        if job_id:
            return str(job_id)
        col = int(np.searchsorted(self.times, t, side="right")) - 1
        for gid in gpu_ids or []:
            host, _, gpu = str(gid).rpartition(":")
            row = self.row_of.get((host, int(gpu))) if gpu.isdigit() else None
            if row is None or col < 0:
                continue
            labels = self._labels(row, slice(0, col + 1))
            named = np.nonzero(labels != "")[0]
            if len(named):
                return str(labels[named[-1]])
        return ""

    def _kind(self, action: Mapping[str, Any]) -> str:
        """Return the kind of the acted job: the trace's ground truth when it has one, else the agent's view."""
        beh = self.truth.get(str(action.get("job_id")))
        if beh:
            return "service" if beh in ("service", "inference", "replica") else ("interactive" if beh == "interactive" else
                                                                     "training")
        return str(action.get("kind") or "training")

    def _procs_at(self, col: int, running: set[str]) -> list[GpuProcess]:
        if self.pid is None or col < 0:
            return []
        pids = self.pid[:, col]
        labels = self._labels(slice(None), col)
        rows = np.nonzero(pids > 0)[0]
        out = []
        for r in rows:
            label = labels[r]
            if label and label in running:
                continue  # a running job's own process: the allocation already attributes the GPU
            user = ""
            if self.user is not None:
                user = str(self.user_names[self.user[r, col]])  # -1 (no user) is the trailing ""
            mem = self.mem[r, col]
            start = float(int(self.times[self.pid_start[r, col]]))  # type: ignore[index]
            job, known = str(label) or None, True
            if job is None and self.unlabelled[r]:
                # no label says whose it is: the job the jobs file has on its GPU when it started, as its cgroup
                # would; none there, and a job the export left out may own it
                holder = self._holder(int(r), start)
                known = holder is not None
                if not known:
                    self.unknown_procs.add((int(r), int(pids[r]), start))
                job = holder if holder and holder not in running else None
            out.append(GpuProcess(
                host=str(self.hosts[r]), pid=int(pids[r]), gpu_uuid=str(self.uuids[r]), gpu=int(self.gpu_idx[r]),
                used_mib=float(mem) if mem == mem else 0.0, start_ts=start, job_id=job, user=user, job_known=known,
            ))
        return out

    def _holder(self, row: int, ts: float) -> str | None:
        """Return the id of the job the jobs file has holding GPU ``row`` at ``ts``, or None. A process may show a
        scrape or two before its job's recorded start; one first seen after a job's end is not that job's (the next
        job's, on a GPU handed over)."""
        if self._holders is None:
            self._holders = {}
            for a in self.allocs.values():
                for r in a.rows.tolist():
                    self._holders.setdefault(int(r), []).append((a.start, a.end, a.job.job_id))
        slack = 2 * self.dt
        for start, end, jid in self._holders.get(row, ()):
            if start - slack <= ts < end:
                return jid
        return None

    def _act(self, decisions: list[Decision], store: Any, t: float, total_gpus: int, run_id: str) -> None:
        """Carry out the engine's acting decisions the simulated humans let act (:meth:`_answered`) through the
        one act path (:func:`gpu_cost.act.dispatch.execute`), at trace time ``t``, on the trace (the executor
        :class:`_TraceEffects` registered while the replay runs); list what was carried out."""
        from gpu_cost.act import dispatch
        from gpu_cost.core.errors import GpuCostError

        chosen = self._answered(decisions, store, t)
        if not chosen:
            return
        ctx = ActionContext(policy=self.policy, dry_run=False, now=t, run_id=run_id, source="trace",
                            cluster_gpus=total_gpus)
        for d, done in zip(chosen, dispatch.execute(chosen, ctx, store), strict=True):
            if done["status"] == "failed":
                raise GpuCostError(f"replay at {iso(t)}: {d.action} on {d.target} failed: {done.get('error')}")
            if done["status"] != "succeeded":
                # held back by the one path: a rolling cap (caps.rolling / caps.entry_points.sweep), the effect
                # guard (another rule's action owns the target's effect) or an earlier attempt of this very action
                if dispatch.cap_held(done):
                    self.res.rolling_capped += 1
                logger.info("replay at %s: %s on %s not carried out: %s %s", iso(t), d.action, d.target,
                            done["status"], done.get("error") or "")
                continue
            entry = {"ts": iso(t), "target": d.target, "job_id": d.job_id, "rule": d.rule, "action": d.action,
                     "user": d.user, "gpus": d.gpus, "requires_approval": d.requires_approval}
            if d.action in NOTICE_ACTIONS:
                self.first_notice.setdefault(d.target, t)
            klass = d.evidence.get("class") or {}
            entry["kind"] = "service" if d.evidence.get("inference") else (
                "interactive" if d.evidence.get("interactive") else str(klass.get("kind") or "training"))
            if d.decision_id in self.killed:
                entry.update(self.killed.pop(d.decision_id))
            self.res.actions.append(entry)

    def _answered(self, decisions: list[Decision], store: Any, t: float) -> list[Decision]:
        """Return the acting decisions the simulated humans let act (``approvals``), their answers written to the
        store as an approver's are; list every destructive rung a human was asked about (:meth:`_asked`)."""
        released = {}
        if self.approvals == "owner" and any(d.acts and d.destructive for d in decisions):
            from gpu_cost.decide.answers import owner_releases

            released = owner_releases(store, sorted({d.target for d in decisions if d.acts and d.destructive}))
        chosen = []
        for d in decisions:
            if not d.acts:
                continue
            if d.requires_approval:
                self.res.approvals_requested += 1
            if d.destructive and (d.requires_approval or self.approvals == "owner"):
                ok = (self.approvals == "approve" or
                      (self.approvals == "owner" and released.get(d.target, math.inf) <= t))
                self._asked(d, t, ok)
                if self.approvals == "owner" and not ok:
                    continue  # the request waits for the owner's answer: asked again next sweep, listed once
                if not ok:
                    store.set_approval(d.decision_id, "rejected", "replay", t)
                    continue
            elif d.requires_approval and self.approvals != "approve":
                store.set_approval(d.decision_id, "rejected", "replay", t)
                continue
            if d.requires_approval:
                store.set_approval(d.decision_id, "approved", "replay", t,
                                   note="released by the owner" if self.approvals == "owner" else None)
            chosen.append(d)
        return chosen

    def _asked(self, d: Decision, t: float, yes: bool) -> None:
        """Record a destructive rung a human was asked about (once per decision), with what the request showed them."""
        asked = self._asked_at.get(d.decision_id)
        if asked is not None:
            if yes:
                asked["answer"] = f"released by the owner at {iso(t)}"
            return
        klass = d.evidence.get("class") or {}
        answer = {"approve": "approved", "reject": "rejected"}.get(self.approvals) or (
            "released by the owner" if yes else "no release by the owner")
        self.res.human_asked.append({
            "ts": iso(t), "target": d.target, "job_id": d.job_id, "rule": d.rule, "action": d.action, "rung": d.rung,
            "user": d.user, "confidence": d.evidence.get("confidence"),
            "kind": "service" if d.evidence.get("inference") else str(klass.get("kind") or "unknown"),
            "asked": "owner" if self.approvals == "owner" else "approver", "answer": answer, "reason": d.reason})
        self._asked_at[d.decision_id] = self.res.human_asked[-1]
        self.res.human_asked_count = len(self.res.human_asked)

    def _run_at(self, job_id: str, t: float) -> _Alloc | None:
        """Return job ``job_id``'s run under way at ``t`` (a requeued job has one per run): the one running then,
        else the latest started by then, else the first."""
        runs = [self.allocs[k] for k in self.runs.get(job_id, [])]
        under_way = [a for a in runs if a.start <= t < a.end]
        if under_way:
            return under_way[0]
        started = [a for a in runs if a.start <= t]
        if started:
            return max(started, key=lambda a: a.start)
        return runs[0] if runs else None

    def _measure(self, rule: str) -> tuple[float, float]:
        """Return the window and idle threshold a job killed by ``rule`` is judged by: that idle rule's own (a session
        terminated by the idle-interactive rule is not measured by the idle-allocation threshold, a knob it never
        reads); the idle-allocation rule's for any other way in."""
        from gpu_cost.core import registry

        p = self.policy
        spec = registry.rules().get(rule)
        if spec is None or not spec.idle_jobs or getattr(p.rules, rule, None) is None:
            rule, spec = "idle_allocation", registry.rules()["idle_allocation"]
        cfg = getattr(p.rules, rule)
        return spec.window(cfg, p), float(cfg.util_max)

    def _kill(self, d: Decision, t: float) -> dict[str, Any]:
        p = self.policy
        kc = int(np.searchsorted(self.times, t, side="right"))
        a = self._run_at(str(d.job_id), t) if d.target_kind == "job" else None
        if a is not None:
            rows = a.rows
            ec = np.full(len(rows), int(np.searchsorted(self.times, a.end, side="left")) if a.end != math.inf
                         else len(self.times))
            ends = np.full(len(rows), min(a.end, float(self.times[-1]) + self.dt))
            a.killed_at = t
            window, thr = self._measure(d.rule)
        elif d.target_kind == "process" and self.pid is not None:
            rows = np.array([self.row_of[(h, int(g))] for h, _, g in (x.rpartition(":") for x in d.evidence.get(
                "gpu_ids", [])) if (h, int(g)) in self.row_of], dtype=np.int64)
            pid = int(d.evidence.get("pid") or 0)
            ec = np.empty(len(rows), dtype=np.int64)
            for i, r in enumerate(rows):
                # the process lasts until a sample shows another (a missed sample is not its end)
                seen = ~(np.isnan(self.util[r, kc:]) & np.isnan(self.mem[r, kc:]))
                other = np.nonzero((self.pid[r, kc:] != pid) & seen)[0]
                ec[i] = kc + int(other[0]) if len(other) else len(self.times)
            ends = np.array([float(self.times[c]) if c < len(self.times) else float(self.times[-1]) + self.dt
                             for c in ec])
            window, thr = p.rules.zombie.window, p.rules.zombie.util_max
        else:
            return {"freed_gpu_hours": 0.0, "false_kill": False, "note": "target not in the trace"}
        self.res.kills += 1
        wc = int(np.searchsorted(self.times, t - window, side="right"))
        # the waste measured on the target before the kill: its idle GPU samples since it started
        if a is not None:
            sc = int(np.searchsorted(self.times, a.start, side="left"))
            seen = [self.util[r, sc:kc] for r in rows]
        else:
            pid = int(d.evidence.get("pid") or 0)
            seen = [self.util[r, :kc][self.pid[r, :kc] == pid] for r in rows]  # type: ignore[index]
        self.waste_seen[d.decision_id] = float(sum(
            np.count_nonzero(np.nan_to_num(u, nan=np.inf) < thr) for u in seen)) * self.dt / 3600.0
        active = False
        # the target's own samples: a sample less than an interval before its end may describe the interval after its
        # time (an export averaged per minute and labelled with the minute's start), partly the next holder's work
        own = np.minimum(ec, np.searchsorted(self.times, ends - self.dt, side="right"))
        for i, r in enumerate(rows):
            seg = self.util[r, wc:own[i]]
            if np.any(np.nan_to_num(seg, nan=0.0) >= thr):
                active = True
            self.util[r, kc:ec[i]] = 0.0
            self.mem[r, kc:ec[i]] = 0.0
            self.job_code[r, kc:ec[i]] = 0
            if self.pid is not None:
                self.pid[r, kc:ec[i]] = 0
            if self.power is not None:
                self.power[r, kc:ec[i]] = np.nan  # no reading of the freed GPU's draw: no sign of progress
        self.rolling.refresh(rows)  # the freed GPUs read idle from the kill on
        freed = float(np.sum(np.maximum(0.0, ends - t)) / 3600.0)
        self.res.reclaimed_gpu_hours += freed
        if active:
            self.res.false_kills += 1
            self.res.false_kill_targets.append(d.target)
        return {"freed_gpu_hours": round(freed, 3), "false_kill": active}


class _TraceEffects:
    """The replay's executor of every action, registered while a replay runs: the trace is its cluster.

    A kill ends its target in the matrices from the kill on (:meth:`_Replay._kill`); other actions change
    nothing in the trace. It reaches a cluster (``touches_cluster``: the dispatcher counts its destructive
    actions in the rolling caps) that is simulated (``simulated``: its clock is the trace's, ``ctx.now``).
    """

    touches_cluster = True
    simulated = True

    def __init__(self, replay: _Replay) -> None:
        self.replay = replay

    def __call__(self, d: Decision, ctx: ActionContext) -> Outcome:
        if d.action not in KILL_ACTIONS:
            return Outcome("succeeded", output="simulated", command=f"(simulated) {d.action} {d.target}")
        effect = self.replay._kill(d, ctx.now)
        self.replay.killed[d.decision_id] = effect
        if "note" in effect:  # nothing freed: no saving is booked
            return Outcome("succeeded", output=str(effect["note"]), command=f"(simulated) {d.action} {d.target}",
                           details={"noop": True})
        return Outcome("succeeded", output=f"simulated: freed {effect['freed_gpu_hours']} GPU-h",
                       command=f"(simulated) {d.action} {d.target}", details=effect)


def summary_text(r: Mapping[str, Any]) -> str:
    """Return the human summary of a replay payload."""
    lines = [f"replay of {r['policy']} as {r['mode']}: {r['gpus']} GPUs, {r['jobs']} jobs, {r['sweeps']} sweeps "
             f"({r['start']} → {r['end']}) in {r['seconds']}s"]
    idle = "n/a" if r["idle_gpu_hours"] is None else f"{r['idle_gpu_hours']:,.1f}"
    lines.append(f"  GPU-hours {r['gpu_hours']:,.1f}  allocated {r['allocated_gpu_hours']:,.1f}  idle (held) {idle}")
    lines.append(f"  reclaimed {r['reclaimed_gpu_hours']:,.1f} GPU-h by {r['kills']} kill(s); "
                 f"false kills: {r['false_kills']}")
    led = r.get("ledger") or {}
    if led.get("savings"):
        lines.append(f"  savings ledger: freed {led['freed_gpu_hours']:,.1f} GPU-h, re-used by other jobs "
                     f"{led['reused_gpu_hours']:,.1f}; waste observed on those targets {led['observed_waste_gpu_hours']:,.1f}")
    if r.get("reclaimed_by_kind") and not r.get("by_behaviour"):
        # without ground truth, the agent's view of each job; with it, the per-behaviour rows below say it
        kinds = ", ".join(f"{k} {v:,.1f}" for k, v in sorted(r["reclaimed_by_kind"].items()))
        lines.append(f"  reclaimed by kind of job (GPU-h): {kinds}")
    if r.get("idle_acted_share") is not None:
        lines.append(f"  idle GPU-hours on the killed targets: {100 * r['idle_acted_share']:.1f} % of all idle GPU-hours")
    for beh, row in sorted((r.get("by_behaviour") or {}).items()):
        first = "" if row["median_first_notice_s"] is None else f", first notice after {row['median_first_notice_s'] / 60:.0f} min"
        lines.append(f"  {beh}: {row['jobs']} job(s), found {row['found']}, notified {row['notified']}, killed "
                     f"{row['killed']} ({row['false_kills']} false), reclaimed "
                     f"{row.get('reclaimed_gpu_hours') or 0.0:,.1f} GPU-h{first}")
    lines.append(f"  decisions: {r['decisions']}; approvals requested {r['approvals_requested']}; "
                 f"capped sweeps {r['capped_sweeps']}; degraded sweeps {r.get('degraded_sweeps', 0)}")
    asked = r.get("human_asked") or []
    if asked:
        conf = sorted(float(a["confidence"]) for a in asked if a.get("confidence") is not None)
        shown = f"; confidence shown {conf[0]:.2f}-{conf[-1]:.2f}" if conf else ""
        lines.append(f"  destructive rungs a human was asked about: {len(asked)}{shown}")
    lines += [f"  note: {n}" for n in r["notes"]]
    return "\n".join(lines)


def _flag(value: Any) -> bool | None:
    """Return a trace's boolean column value (True/False, 1/0, "true"/"false"), None when absent."""
    if value is None or value != value or value == "":
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "y", "t")
    return bool(value)
