"""Trace files (CSV or Parquet) in the design's trace format: samples and jobs, for any instant.

samples: ``ts, host, gpu, util, mem_used_mib`` required; ``mem_total_mib, power_w, job_id, pid,
user`` optional. jobs: ``job_id, user, start_ts`` required; ``account, partition, name, state,
submit_ts, end_ts, time_limit_s, gpus, nodes, gpu_ids, labels`` optional. Times are ISO 8601 or
epoch seconds (UTC). Faults name the file and the column.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_cost.core.errors import TraceError
from gpu_cost.core.model import Job, labels_from_comment
from gpu_cost.core.timeutil import format_duration

logger = logging.getLogger(__name__)

SAMPLE_COLUMNS = ("ts", "host", "gpu", "util", "mem_used_mib")
JOB_COLUMNS = ("job_id", "user", "start_ts")


def read_table(path: str | Path, what: str, columns: tuple[str, ...] | None = None, *,
               categories: tuple[str, ...] = (), single: tuple[str, ...] = ()) -> pd.DataFrame:
    """Read a CSV or Parquet trace file (only ``columns`` that exist, when given); errors name the file.

    ``categories``: columns read as pandas categoricals of their text (a 10 M-row week's host, job
    and user columns take a few MB of codes instead of ~140 MB of strings each). ``single``: numeric
    columns of a Parquet file read in single precision (a week's is 40 MB, not 80), for readings that
    need no more (watts).
    """
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: {what} file not found")
    try:
        if p.suffix.lower() in (".parquet", ".pq"):
            if columns is None and not categories and not single:
                return pd.read_parquet(p)
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pq.read_schema(p)
            wanted = [c for c in (columns if columns is not None else schema.names) if c in schema.names]
            text = [c for c in categories if c in wanted
                    and (pa.types.is_string(schema.field(c).type) or pa.types.is_large_string(schema.field(c).type))]
            # one column at a time, each handed back to the system once converted: a week's samples are
            # 80 MB a column, and the whole table beside its frame would double the read's peak
            frame = pd.DataFrame(index=pd.RangeIndex(pq.read_metadata(p).num_rows))
            for c in wanted:
                table = pq.read_table(p, columns=[c], read_dictionary=[c] if c in text else None)
                if c in single and pa.types.is_floating(schema.field(c).type):
                    table = table.cast(pa.schema([pa.field(c, pa.float32())]))
                # the file's own index, as pandas wrote it (a filtered frame's: 5760, 5761...), would align the
                # column against this frame's and leave NaN where the two differ: each column by position
                frame[c] = table.to_pandas(self_destruct=True, ignore_metadata=True)[c].array
                del table
                release_arrow_memory()
            return frame
        dtype = dict.fromkeys(categories, "category")
        if columns is not None:
            return pd.read_csv(p, low_memory=False, usecols=lambda c: c in columns, dtype=dtype)
        return pd.read_csv(p, low_memory=False, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{p}: cannot read {what}: {exc}") from None


def release_arrow_memory() -> None:
    """Hand the memory Arrow keeps for reuse back to the system (columns read from Parquet live in Arrow's pool:
    once dropped, their memory stays with the pool until asked for)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _epoch_col(values: pd.Series, source: str, col: str) -> np.ndarray:
    if pd.api.types.is_numeric_dtype(values):
        return _seconds(values.to_numpy(dtype=float), source, col)
    try:
        parsed = pd.to_datetime(values, utc=True, errors="raise", format="mixed")
    except (ValueError, TypeError) as exc:
        unknown = values.astype(str).str.strip().str.lower().isin(NOT_KNOWN).to_numpy()
        if unknown.any():  # accounting's word for a time not known (a running job's end): not known
            out = np.full(len(values), math.nan)
            if not unknown.all():
                out[~unknown] = _epoch_col(values[~unknown], source, col)
            return out
        num = pd.to_numeric(values, errors="coerce")
        if num.notna().sum() == values.notna().sum():
            return _seconds(num.to_numpy(dtype=float), source, col)
        raise TraceError(f"{source}: column {col}: not ISO 8601 or epoch seconds ({exc})") from None
    out = (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(dtype=float)
    return out


#: epoch times above these are in milliseconds, microseconds, nanoseconds (seconds reach 1e11 in the year 5138)
_EPOCH_UNITS = ((1e17, 1e9, "nanoseconds"), (1e14, 1e6, "microseconds"), (1e11, 1e3, "milliseconds"))


def _seconds(epoch: np.ndarray, source: str, col: str) -> np.ndarray:
    """Return epoch times as seconds: a column in milliseconds (what JavaScript, Java and many loggers write), micro-
    or nanoseconds (pandas, Arrow) is read in its unit, told by its size; seconds as they are."""
    per_second = _per_second(epoch, source, col)
    return epoch if per_second == 1.0 else epoch / per_second


def _per_second(epoch: np.ndarray, source: str, col: str) -> float:
    """Return how many of the unit of the epoch times ``epoch`` make a second (1: seconds)."""
    seen = np.asarray(epoch[:: max(1, len(epoch) // 10_000)], dtype=float)  # 10,000 rows over the column tell it
    seen = seen[np.isfinite(seen)]
    if not len(seen):
        return 1.0
    typical = float(np.median(np.abs(seen)))
    for above, per_second, unit in _EPOCH_UNITS:
        if typical > above:
            logger.info("%s: column %s read as epoch %s", source, col, unit)
            return per_second
    return 1.0


#: the measured sample columns, each with the units its values may carry as text (nvidia-smi's CSV writes
#: ``45 %``, ``1234 MiB``, ``61.52 W``) and what each is worth in the column's own unit
MEASURES: dict[str, dict[str, float]] = {
    "util": {"%": 1.0},
    "mem_used_mib": {"MiB": 1.0, "GiB": 1024.0, "KiB": 1.0 / 1024},
    "mem_total_mib": {"MiB": 1.0, "GiB": 1024.0, "KiB": 1.0 / 1024},
    "power_w": {"W": 1.0},
}
#: what exporters, nvidia-smi and accounting write for a value they do not have (a running job's end: ``Unknown``):
#: read as not known, in a measure, a time or a GPU count
NOT_KNOWN = frozenset({"", "n/a", "[n/a]", "[not supported]", "not supported", "nan", "none", "null", "(null)", "-",
                       "unknown"})
_MEASURE = r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%]*)\s*$"


def _measure(values: pd.Series, source: str, col: str) -> np.ndarray:
    """Return a measured column written as text as numbers in the column's unit (a unit of :data:`MEASURES`
    converted, one the trace format does not know refused); an unreadable value names its row."""
    codes, uniq = pd.factorize(values, use_na_sentinel=True)
    text = pd.Series([str(u) for u in uniq], dtype=object)
    parts = text.str.extract(_MEASURE)
    number = pd.to_numeric(parts[0], errors="coerce").to_numpy(dtype=float)
    units = MEASURES[col]
    factor = parts[1].fillna("").map(lambda u: units.get(u, 1.0 if u == "" else math.nan)).to_numpy(dtype=float)
    known = ~text.str.strip().str.lower().isin(NOT_KNOWN).to_numpy()
    bad = np.flatnonzero(known & ~np.isfinite(number * factor))
    if len(bad):
        row = int(np.flatnonzero(codes == bad[0])[0])
        raise TraceError(f"{source}: column {col}, row {row + 1}: {uniq[bad[0]]!r} is not a number "
                         f"(units read: {', '.join(units)}; not known: empty or N/A)")
    value = np.where(known, number * factor, math.nan)
    return np.append(value, math.nan)[codes]  # a missing cell (code -1) reads not known


#: a trace whose busy samples' memory is never above this (MiB) is in GiB or percent: a CUDA context alone is larger,
#: and the largest GPUs hold under 200 GiB
MAX_BUSY_GIB = 200.0
#: busy samples (util at least 50 %) that must agree before memory is judged to be in GiB
MIN_BUSY_SAMPLES = 100


def _check_scale(out: pd.DataFrame, source: str) -> None:
    """Refuse a util column in fractions (0–1: DCGM's ratios) and a memory column in bytes or GiB: read as the format's
    percent and MiB, the first would make every GPU idle, the second every memory reading impossible and the third
    every job's memory as small as an unused GPU's."""
    from gpu_cost.perceive.aggregate import MAX_MEM_MIB

    # no copy of a 10 M-row column: reductions and masks only
    util = out["util"].to_numpy(dtype=float)
    if len(util) and np.fmax.reduce(util) <= 1.0:  # NaN when nothing is known: not <= 1
        fraction = np.flatnonzero((util > 0) & (util < 1))
        if len(fraction):
            row = int(fraction[0])
            raise TraceError(f"{source}: column util holds fractions (no value above 1; row {row + 1}: {util[row]:g}), "
                             "but the trace format's util is percent 0-100: multiply it by 100 (a cluster below 1 % "
                             "for the whole trace: round util to whole percent)")
    mem = out["mem_used_mib"].to_numpy(dtype=float)
    over = mem > MAX_MEM_MIB
    if np.count_nonzero(over) > np.count_nonzero(np.isfinite(mem)) / 2:
        row = int(np.flatnonzero(over)[0])
        raise TraceError(f"{source}: column mem_used_mib is mostly above {MAX_MEM_MIB:.0f} MiB (2 TiB; row {row + 1}: "
                         f"{mem[row]:g}): it looks like bytes or KiB; the trace format wants MiB")
    # the other way: GiB (or a share of the memory, in percent). Read as MiB, every job's memory would look like a
    # GPU nobody uses: no zombie's memory seen, and a service's resident memory (what tells it from an idle job) gone
    with np.errstate(invalid="ignore"):
        busy = util >= 50.0
    if np.count_nonzero(busy) >= MIN_BUSY_SAMPLES and np.fmax.reduce(mem[busy]) <= MAX_BUSY_GIB:
        row = int(np.flatnonzero(busy)[0])
        raise TraceError(f"{source}: column mem_used_mib is never above {MAX_BUSY_GIB:g} on a busy GPU (row {row + 1}: "
                         f"util {util[row]:g} %, memory {mem[row]:g}), but a GPU running work holds its context, "
                         "hundreds of MiB at least: it looks like GiB, a percentage, or not measured (0); the trace format "
                         "wants MiB (leave it empty where not measured)")
    if "mem_total_mib" in out.columns:
        total = out["mem_total_mib"].to_numpy(dtype=float)
        if np.isfinite(total).any() and np.fmax.reduce(total) < 1024.0:
            row = int(np.flatnonzero(np.isfinite(total))[0])
            raise TraceError(f"{source}: column mem_total_mib is under 1024 everywhere (row {row + 1}: {total[row]:g}): "
                             "no GPU has under 1 GiB; it looks like GiB; the trace format wants MiB")


#: a whole number written as a float (``100001.0``)
_FLOAT_TEXT = re.compile(r"^(\d+)\.0*$")


def whole_ids(ids: pd.Series) -> pd.Series:
    """Return a job id column of whole numbers written as floats (a CSV column with blanks is read as floats, and
    written back or to Parquet so: ``100001.0``) as the ids Slurm's are (``100001``), missing kept missing; any
    other column as it is. Read as text, ``100001.0`` would name no job of the jobs file's ``100001``."""
    if pd.api.types.is_integer_dtype(ids):
        return ids  # whole already: read as text as they are
    if isinstance(ids.dtype, pd.CategoricalDtype):  # the replay reads its text columns so: only the names to read
        names = _whole_names([str(c) for c in ids.cat.categories])
        return ids if names is None else ids.cat.rename_categories(names)
    codes, uniq = pd.factorize(ids, use_na_sentinel=True)  # a few thousand ids in ten million rows: each once
    if pd.api.types.is_float_dtype(ids):
        values = np.asarray(uniq, dtype=float)
        if not np.all(np.isfinite(values) & (values == np.floor(values))):
            return ids
        names = [str(int(v)) for v in values]
        names = names if len(set(names)) == len(names) else None
    else:
        names = _whole_names([str(u) for u in uniq])
    return ids if names is None else pd.Series(pd.Categorical.from_codes(codes, categories=names), index=ids.index,
                                               name=ids.name)


def _whole_names(texts: list[str]) -> list[str] | None:
    """Return distinct texts of whole numbers with the float's ``.0`` taken off, or None when none has one, one is
    no number, or two would become one (``7`` and ``7.0``)."""
    found = [_FLOAT_TEXT.match(t) for t in texts]
    if not any(found) or not all(m or t.isdigit() for m, t in zip(found, texts, strict=True)):
        return None
    names = [m.group(1) if m else t for m, t in zip(found, texts, strict=True)]
    return names if len(set(names)) == len(names) else None


#: a jobs file whose times are off the samples' by at least this much, for most jobs alike, is in another clock
#: (sacct prints local time without its offset); time zones differ by 30 min at least
CLOCK_OFF_MIN_S = 1800.0
#: how closely the jobs must agree on the offset (labels appear and vanish within a scrape or a prolog's minutes)
CLOCK_AGREE_S = 600.0
#: sample steps within which an exporter's job label appears after a job's start (or vanishes after its end): a
#: scrape, and the one after it; a start or an end further off the label is not where the job held its GPUs
LABEL_EDGE_STEPS = 2


def check_job_clock(jobs: pd.DataFrame, spans: Mapping[str, tuple[float, float]], first_ts: float, last_ts: float,
                    step: float) -> None:
    """Refuse a jobs file whose times are off the samples' by one offset (a zone written as UTC).

    ``spans``: per job label, the first and last sample time the exporter labels a GPU with it. A job's label
    appears at its start and vanishes at its end, within a scrape; a jobs file written in local time (``sacct``'s
    default has no offset) puts every job hours off. Read so, a job would be gone while its processes run, and
    its GPUs' processes would look like zombies. Each labelled job that starts (or ends) inside the samples'
    span gives one offset; when at least 5 do, and 80 % of them lie within :data:`CLOCK_AGREE_S` of their
    median, a median of :data:`CLOCK_OFF_MIN_S` or more is refused.
    """
    if not spans or "start_ts" not in jobs.columns:
        return
    edge = LABEL_EDGE_STEPS * step
    offsets: list[float] = []
    ends = jobs["end_ts"] if "end_ts" in jobs.columns else pd.Series(math.nan, index=jobs.index)
    for jid, start, end in zip(jobs["job_id"].astype(str), jobs["start_ts"], ends, strict=True):
        span = spans.get(jid)
        if span is None:
            continue
        first, last = span
        if first > first_ts + edge and start == start:
            offsets.append(first - float(start))
        if last < last_ts - edge and end == end and not math.isinf(end):
            offsets.append(last - float(end))
    if len(offsets) < 5:
        return
    median = float(np.median(offsets))
    agree = float(np.mean(np.abs(np.array(offsets) - median) <= CLOCK_AGREE_S))
    if abs(median) >= CLOCK_OFF_MIN_S and agree >= 0.8:
        raise TraceError(
            f"{jobs.attrs.get('source', '<jobs>')}: the jobs' times run {abs(median) / 3600:.2f} h "
            f"{'ahead of' if median < 0 else 'behind'} the samples': the exporter labels each job's GPUs from and "
            f"until that long {'before' if median < 0 else 'after'} its start_ts and end_ts ({agree:.0%} of "
            f"{len(offsets)} starts and ends agree). "
            "The jobs file looks written in another time zone (sacct prints local time without its offset): "
            "write its times in UTC, or in ISO 8601 with their offset")


def labelled_starts(jobs: pd.DataFrame, spans: Mapping[str, tuple[float, float]], first_ts: float,
                    step: float) -> tuple[pd.DataFrame, str | None]:
    """Return ``jobs`` with each start the samples contradict moved to the job's first label, and a note (None: none).

    ``spans``: per job label, the first and last sample time the exporter labels a GPU with it. A job's label
    appears within a scrape of its start (the prolog writes the exporter's job mapping), so a ``start_ts`` more
    than two steps before the job's first labelled sample, inside the samples' span, is not when it took its
    GPUs: a submit time written as the start, a queue wait counted in. Read so, the job would run on GPUs it did
    not hold yet, idle, with its warm-up (``min_runtime``) long past, and be found idle, escalated and ended for
    time it spent queued. Such a start is taken a step before its first labelled sample, the latest the samples
    allow: the job is younger, never older, than the file says. A requeued job's later runs start after its
    first label, and are left as written. (:func:`check_job_clock` refuses every job off by one offset first.)
    """
    if not spans or "start_ts" not in jobs.columns or not len(jobs):
        return jobs, None
    edge = LABEL_EDGE_STEPS * step
    ids = jobs["job_id"].astype(str).tolist()
    starts = jobs["start_ts"].to_numpy(dtype=float)
    moved: dict[str, float] = {}
    new = starts.copy()
    for i, (jid, start) in enumerate(zip(ids, starts.tolist(), strict=True)):
        span = spans.get(jid)
        if span is None or start != start:
            continue
        first = span[0]
        if first > first_ts + edge and first - start > edge:
            new[i] = first - step
            moved[jid] = max(moved.get(jid, 0.0), first - step - start)
    if not moved:
        return jobs, None
    from gpu_cost.perceive.correlate import some

    out = jobs.assign(start_ts=new)
    out.attrs = dict(jobs.attrs)
    worst = max(moved, key=lambda j: moved[j])
    note = (f"{len(moved)} job(s) start in the jobs file before the samples first label their GPUs with them "
            f"({some(sorted(moved), 3)}; {worst} by {format_duration(moved[worst])}): each is taken to start a "
            "sample before its first label, as the samples say; its start_ts may be its submit time")
    return out, note


def label_spans(samples: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Return, per job label of long samples, the first and last sample time that carries it."""
    if "job_id" not in samples.columns:
        return {}
    labels = samples["job_id"].astype(object)
    keep = labels.notna().to_numpy() & (labels.astype(str) != "").to_numpy()
    if not keep.any():
        return {}
    g = samples.loc[keep, "ts"].groupby(labels[keep].astype(str).to_numpy())
    return {str(k): (float(a), float(b)) for k, a, b in zip(g.min().index, g.min(), g.max(), strict=True)}


def normalise_samples(samples: pd.DataFrame, source: str = "<samples>") -> pd.DataFrame:
    """Return samples with the required columns checked, ``ts`` as epoch seconds and the measured columns as numbers.

    Measures written with their units (nvidia-smi's CSV: ``45 %``, ``1234 MiB``) are read in the format's
    units; util in fractions and memory in bytes are refused (:func:`_check_scale`).
    """
    missing = [c for c in SAMPLE_COLUMNS if c not in samples.columns]
    if missing:
        raise TraceError(f"{source}: samples lack column(s) {', '.join(missing)} "
                         f"(required: {', '.join(SAMPLE_COLUMNS)})")
    out = samples
    text = {c: _measure(out[c], source, c) for c in MEASURES if c in out.columns
            and not pd.api.types.is_numeric_dtype(out[c])}
    if text:
        out = out.assign(**text)
    _check_scale(out, source)
    if not pd.api.types.is_numeric_dtype(out["ts"]):
        out = out.assign(ts=_epoch_col(out["ts"], source, "ts"))
    elif (per_second := _per_second(out["ts"].to_numpy(), source, "ts")) != 1.0:  # milliseconds (Grafana's CSV)
        out = out.assign(ts=out["ts"] / per_second)
    if not pd.api.types.is_integer_dtype(out["gpu"]):
        gpu = pd.to_numeric(out["gpu"], errors="coerce")
        if gpu.isna().any():
            i = int(np.flatnonzero(gpu.isna().to_numpy())[0])
            v = out["gpu"].iloc[i]
            hint = (". A device name such as nvidia3 is the device file's minor number, which need not be the GPU's "
                    "index: write the exporter's gpu label (NVML's index)") if isinstance(v, str) and v.strip() else ""
            raise TraceError(f"{source}: column gpu must hold GPU indices (integers); row {i + 1} has "
                             f"{'no value' if pd.isna(v) or not str(v).strip() else repr(str(v))}{hint}")
        out = out.assign(gpu=gpu.astype(np.int64))
    if "job_id" in out.columns:
        ids = whole_ids(out["job_id"])
        if ids is not out["job_id"]:
            out = out.assign(job_id=ids)
    hosts = _stripped(out["host"])
    if hosts is not out["host"]:
        out = out.assign(host=hosts)
    negative = np.flatnonzero(out["gpu"].to_numpy() < 0)
    if len(negative):
        raise TraceError(f"{source}: column gpu must hold GPU indices (0 or more); row {int(negative[0]) + 1} "
                         f"has {int(out['gpu'].iloc[int(negative[0])])}")
    return out


def _stripped(text: pd.Series) -> pd.Series:
    """Return a text column (a host name) without the spaces a hand-made CSV puts around its values (``a, b``): read
    with them, `` gpu01`` is no node the jobs name, and its GPUs no job's. Each distinct value is looked at once; the
    column is returned as it is when none has any."""
    if isinstance(text.dtype, pd.CategoricalDtype):
        names = [str(c) for c in text.cat.categories]
        if not any(n != n.strip() for n in names):
            return text
        return text.astype(str).str.strip().astype("category")
    uniq = text.dropna().unique()
    if not any(str(u) != str(u).strip() for u in uniq):
        return text
    return text.astype(str).str.strip()


#: a job step's id as accounting lists it beside its job: ``1001.batch``, ``1001.extern``, ``1003_1.0``, ``7+0.2``
_STEP = re.compile(r"^(.+)\.(?:batch|extern|interactive|\d+)$")


def _without_steps(jobs: pd.DataFrame, source: str) -> pd.DataFrame:
    """Drop the rows of job steps (``sacct`` lists ``1001.batch``, ``1001.0``… beside ``1001``): each is part of its
    job, which holds the GPUs; counted as jobs they would hold them again. A step whose job is absent stays."""
    parent = jobs["job_id"].str.extract(_STEP, expand=False)
    step = parent.notna().to_numpy() & parent.isin(set(jobs["job_id"])).to_numpy()
    if step.any():
        logger.info("%s: %d job step row(s) (%s…) left out: their jobs hold the GPUs", source, int(step.sum()),
                    jobs["job_id"].to_numpy()[step][0])
        return jobs[~step]  # the index keeps each row's place in the file, for errors that name it
    return jobs


def _gpus_col(values: pd.Series, source: str) -> np.ndarray:
    """Return a jobs' ``gpus`` column written as accounting does (``gres/gpu=4``, ``gpu:a100:4``) as counts."""
    from gpu_cost.perceive.slurm import gpus_of_text

    out = np.full(len(values), math.nan)
    for i, (row, v) in enumerate(zip(values.index, values.tolist(), strict=True)):
        if v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip().lower() in NOT_KNOWN:
            continue
        n = gpus_of_text(str(v))
        if n is None:
            raise TraceError(f"{source}: column gpus, row {row + 1}: {v!r} is not a GPU count "
                             "(a number, a TRES list such as cpu=8,gres/gpu=4, or a GRES such as gpu:a100:4)")
        out[i] = n
    return out


def _limit_col(values: pd.Series, source: str) -> np.ndarray:
    """Return a jobs' ``time_limit_s`` column as seconds: numbers as they are, Slurm's ``D-HH:MM:SS`` forms read,
    ``UNLIMITED`` and the like not known."""
    from gpu_cost.perceive.slurm import time_limit_of_text

    out = np.full(len(values), math.nan)
    for i, (row, v) in enumerate(zip(values.index, values.tolist(), strict=True)):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        text = str(v).strip()
        try:
            out[i] = float(text)
            continue
        except ValueError:
            pass
        try:
            limit = time_limit_of_text(text)
        except ValueError:
            raise TraceError(f"{source}: column time_limit_s, row {row + 1}: {v!r} is neither seconds nor a Slurm "
                             "time limit (D-HH:MM:SS, HH:MM:SS, UNLIMITED)") from None
        out[i] = math.nan if limit is None else limit
    return out


def normalise_jobs(jobs: pd.DataFrame, source: str = "<jobs>") -> pd.DataFrame:
    """Return jobs with the required columns checked, times as epoch seconds, GPU counts and time limits as numbers
    (accounting's forms read) and job step rows left out."""
    missing = [c for c in JOB_COLUMNS if c not in jobs.columns]
    if missing:
        raise TraceError(f"{source}: jobs lack column(s) {', '.join(missing)} (required: {', '.join(JOB_COLUMNS)})")
    out = jobs.reset_index(drop=True)  # a copy; the index is each row's place in the file until steps are left out
    out["job_id"] = whole_ids(out["job_id"]).astype(object).astype(str)
    out = _without_steps(out, source)
    out["user"] = out["user"].fillna("").astype(str)
    for col in ("start_ts", "end_ts", "submit_ts", "linger_end_ts"):
        if col in out.columns:
            seconds = _epoch_col(out[col], source, col)
            # Slurm's JSON (sacct --json) writes 0 for a time not known yet: a pending job's start, a running one's end
            out[col] = np.where(seconds == 0, math.nan, seconds)
    if "end_ts" in out.columns:
        before = np.flatnonzero(out["end_ts"].to_numpy() < out["start_ts"].to_numpy())  # NaN compares false
        if len(before):
            i = int(before[0])
            raise TraceError(f"{source}: row {int(out.index[i]) + 1} (job {out['job_id'].iloc[i]}): end_ts "
                             f"{out['end_ts'].iloc[i]:.0f} is before start_ts {out['start_ts'].iloc[i]:.0f}")
    for col, read in (("gpus", _gpus_col), ("time_limit_s", _limit_col)):
        if col in out.columns and not pd.api.types.is_numeric_dtype(out[col]):
            out[col] = read(out[col], source)
    if "time_limit_s" in out.columns and "end_ts" in out.columns:
        check_limits(out, source)
    for col in ("account", "partition", "name", "labels", "gpu_ids", "nodes", "state", "qos"):
        if col in out.columns:
            out[col] = out[col].fillna("").astype(str)
    if "nodes" in out.columns:
        _check_nodes(out["nodes"], source)
    if "gpu_ids" in out.columns:
        _check_gpu_ids(out["gpu_ids"], source)
    out, repeated = _once_each(out)
    if repeated:
        logger.info("%s: %d job row(s) repeat another's job and start: each job read once", source, repeated)
    out, cut = _runs_apart(out)
    if cut:
        logger.info("%s: %d run(s) of a requeued job read as ended when its next run started", source, cut)
    out = out.reset_index(drop=True)
    out.attrs["source"] = source  # for errors found later, when the jobs are read beside the samples
    out.attrs["repeated_rows"] = repeated
    out.attrs["runs_cut"] = cut
    return out


#: a limit check reads the ended jobs that ran at least this long (a short job says little about a unit)
LIMIT_CHECK_MIN_RUN_S = 600.0
#: ... and needs this many of them
LIMIT_CHECK_MIN_JOBS = 20


def check_limits(jobs: pd.DataFrame, source: str) -> None:
    """Refuse a ``time_limit_s`` column in minutes (``sacct``'s ``TimelimitRaw`` is minutes).

    A scheduler ends a job at its limit (Slurm's ``OverTimeLimit`` adds minutes at most), so on a real trace hardly
    an ended job runs past half again its limit. Read as seconds, limits in minutes are 60 times too short: most
    jobs "run past" them, every job's stakes and the savings until its limit are 0, and a forecast's baseline is
    nonsense. Of the ended jobs that ran :data:`LIMIT_CHECK_MIN_RUN_S` or more with a limit (at least
    :data:`LIMIT_CHECK_MIN_JOBS`), when half ran past 1.5 times it and nearly all fit 60 times it, the column is
    refused."""
    limit = pd.to_numeric(jobs["time_limit_s"], errors="coerce").to_numpy(dtype=float)
    ran = (jobs["end_ts"] - jobs["start_ts"]).to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        read = (ran >= LIMIT_CHECK_MIN_RUN_S) & (limit > 0) & np.isfinite(limit)
    if int(read.sum()) < LIMIT_CHECK_MIN_JOBS:
        return
    over = ran[read] > 1.5 * limit[read]
    as_minutes = ran[read] <= 1.5 * 60 * limit[read] + LIMIT_CHECK_MIN_RUN_S
    if over.mean() >= 0.5 and as_minutes.mean() >= 0.9:
        i = int(np.flatnonzero(read)[int(np.argmax(over))])
        raise TraceError(
            f"{source}: column time_limit_s looks like minutes (sacct's TimelimitRaw is): {over.mean():.0%} of "
            f"{int(read.sum())} ended jobs that ran {LIMIT_CHECK_MIN_RUN_S / 60:g} min or more ran past half again "
            f"their limit (row {int(jobs.index[i]) + 1}, job {jobs['job_id'].iloc[i]}: ran {ran[i]:.0f} s, limit "
            f"{limit[i]:g}), where a scheduler ends a job at it. Write the limits in seconds, or in Slurm's form "
            "(2-00:00:00)")


def _runs_apart(jobs: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Return the jobs with each run of one job id ending by the time its next run starts, and how many were cut.

    Slurm runs one job id once at a time: a requeued job's run ends before the next begins. A run whose end is
    unknown or later than that (written while it ran, then requeued) would run beside its successor, each judged
    and told as the job. It is read as ended when the next run starts."""
    if not jobs["job_id"].duplicated().any():
        return jobs, 0
    if "end_ts" not in jobs.columns:
        jobs = jobs.assign(end_ts=math.nan)
    order = jobs.sort_values(["job_id", "start_ts"], kind="stable")
    following = order.groupby("job_id", sort=False)["start_ts"].shift(-1)
    over = following.notna() & order["start_ts"].notna() & ~(order["end_ts"] <= following)
    if not over.any():
        return jobs, 0
    jobs = jobs.copy()
    jobs.loc[over.index[over.to_numpy()], "end_ts"] = following[over]
    return jobs, int(over.sum())


def _once_each(jobs: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Return the jobs with each (job id, start) once, and how many rows were left out. Exports concatenated over
    overlapping spans list a job twice, once maybe while it ran (no end yet): the row with the latest known end is
    kept. Counted twice, a job would be judged, and its owner told, twice. A requeued job's runs start apart: all
    kept."""
    key = ["job_id", "start_ts"]
    if not jobs.duplicated(key).any():
        return jobs, 0
    # each job where it first appears (the order of the file is the order jobs are read in), with its best row
    group = jobs.groupby(key, dropna=False, sort=False).ngroup()
    order = pd.Series(jobs.index, index=jobs.index).groupby(group).transform("min")
    best = jobs.sort_values("end_ts", na_position="first", kind="stable") if "end_ts" in jobs.columns else jobs
    once = best.drop_duplicates(key, keep="last")
    once = once.loc[order.loc[once.index].sort_values(kind="stable").index]
    return once, len(jobs) - len(once)


def node_names(text: str) -> tuple[str, ...]:
    """Return the hosts a jobs trace's ``nodes`` cell names: a Slurm host list (``gpu[01-02]``); a count (``2``,
    as some exports write it) names none. Raises ValueError on a host list that does not parse."""
    from gpu_cost.perceive.slurm import expand_hostlist

    text = text.strip()
    return () if not text or text.isdigit() else tuple(expand_hostlist(text))


def _check_nodes(values: pd.Series, source: str) -> None:
    """Refuse a ``nodes`` cell that is no Slurm host list, naming its row."""
    for v in values.unique().tolist():  # a job trace repeats its few nodes: each text parsed once
        try:
            node_names(v)
        except ValueError as exc:
            row = int(values.index[(values == v).to_numpy()][0])
            raise TraceError(f"{source}: column nodes, row {row + 1}: {v!r} is not a Slurm host list ({exc})") from None



def read_samples(path: str | Path) -> pd.DataFrame:
    """Read and check a samples file."""
    return normalise_samples(read_table(path, "samples"), str(path))


def read_jobs(path: str | Path) -> pd.DataFrame:
    """Read and check a jobs file."""
    return normalise_jobs(read_table(path, "jobs"), str(path))


#: a job as :func:`whole_nodes` reads it: id, start, end, the nodes it names, the GPUs it holds, those placed per host
Held = tuple[str, float, float, tuple[str, ...], int, Mapping[str, Sequence[int]]]


def whole_nodes(jobs: Sequence[Held], node_gpus: Mapping[str, Sequence[int]]) -> dict[str, dict[str, list[int]]]:
    """Return, for each job no source places that takes whole nodes, every GPU of its nodes (per host).

    A job without ``gpu_ids`` and without samples labelled with it (an accounting export) holds whole nodes
    when its GPU count is what its nodes have (``node_gpus``: the GPU indices the samples show per host), the
    same on each, and no other job is on any of them while it runs: Slurm then gives those GPUs to it alone.
    Any other job stays unplaced (``Job.unplaced_gpus``: :func:`gpu_cost.perceive.correlate.attribute`).
    """
    on: dict[str, list[tuple[float, float, str]]] = {}
    for jid, start, end, nodes, _, placed in jobs:
        for h in {*nodes, *placed}:
            on.setdefault(h, []).append((start, end, jid))
    out: dict[str, dict[str, list[int]]] = {}
    for jid, start, end, nodes, gpus, placed in jobs:
        if placed or not nodes or gpus <= 0:
            continue
        sizes = {len(node_gpus.get(h, ())) for h in nodes}
        if len(sizes) != 1 or next(iter(sizes)) * len(nodes) != gpus:
            continue
        if any(other != jid and s < end and start < e for h in nodes for s, e, other in on[h]):
            continue
        out[jid] = {h: sorted(int(i) for i in node_gpus[h]) for h in nodes}
    return out


def jobs_at(jobs: pd.DataFrame, samples: pd.DataFrame, t: float) -> list[Job]:
    """Return the jobs running at ``t``; GPUs from ``gpu_ids`` (``host:idx,...``), the samples' job labels, or a
    job's whole nodes (:func:`whole_nodes`)."""
    running: list[tuple[Mapping[str, Any], dict[str, list[int]]]] = []
    window = samples[(samples["ts"] <= t) & (samples["ts"] > t - 3600)]
    recent = window if "job_id" in samples.columns else None
    for rec in jobs.to_dict("records"):
        start = rec.get("start_ts")
        if start is None or start != start or start > t:
            continue
        end = rec.get("end_ts")
        if end is not None and end == end and not math.isinf(end) and end <= t:
            continue
        jid = str(rec["job_id"])
        alloc: dict[str, list[int]] = {}
        for host, gpu in parse_gpu_ids(rec.get("gpu_ids")):
            alloc.setdefault(host, []).append(gpu)
        if not alloc and recent is not None:
            mine = recent[recent["job_id"].astype(str) == jid][["host", "gpu"]].drop_duplicates()
            for host, gpu in mine.itertuples(index=False):
                alloc.setdefault(str(host), []).append(int(gpu))
        running.append((rec, alloc))
    held = [trace_job(rec, alloc) for rec, alloc in running]
    if any(j.unplaced_gpus for j in held):
        node_gpus = {str(h): sorted({int(g) for g in part}) for h, part in window.groupby("host")["gpu"]}
        whole = whole_nodes([(j.job_id, 0.0, math.inf, j.nodes, j.gpus_requested, dict(j.gpu_alloc)) for j in held],
                            node_gpus)
        held = [trace_job(rec, whole.get(str(rec["job_id"]), alloc)) for rec, alloc in running]
    return held


def trace_job(rec: Mapping[str, Any], alloc: Mapping[str, Sequence[int]], **more: Any) -> Job:
    """Return a jobs trace's row as the running job it is, holding the GPUs ``alloc`` places (per host, indices).

    A job the trace does not place (no ``gpu_ids``, no sample labelled with it: an accounting export) still holds
    the GPUs its ``gpus`` column counts, on the nodes its ``nodes`` column names (a Slurm host list; a count names
    none): :func:`gpu_cost.perceive.correlate.attribute` then calls none of those nodes' GPUs "no job's".
    """
    placed = sum(len(v) for v in alloc.values())
    asked = rec.get("gpus")
    asked = int(asked) if isinstance(asked, int | float) and asked == asked and asked > 0 else 0
    names = rec.get("nodes")
    on = tuple(sorted(alloc))
    if asked > placed and isinstance(names, str):
        on = tuple(sorted({*on, *node_names(names)}))
    labels = tuple(x for x in str(rec.get("labels") or "").replace(";", ",").split(",") if x)
    labels += labels_from_comment(str(rec.get("comment") or ""))
    limit = rec.get("time_limit_s")
    return Job(
        job_id=str(rec["job_id"]), user=str(rec.get("user") or ""), state="RUNNING", start_ts=float(rec["start_ts"]),
        account=str(rec.get("account") or ""), partition=str(rec.get("partition") or ""),
        qos=str(rec.get("qos") or ""), name=str(rec.get("name") or ""),
        time_limit_s=float(limit) if limit is not None and limit == limit else None,
        nodes=on, gpu_alloc=tuple((h, tuple(sorted(i))) for h, i in sorted(alloc.items())),
        gpus_requested=max(placed, asked), labels=labels, **more,
    )


def snapshot(policy: Any, now: float, samples: str | Path | pd.DataFrame, jobs: str | Path | pd.DataFrame) -> Any:
    """Return the snapshot of a trace at ``now`` (processes are unknown in a trace)."""
    from gpu_cost.perceive.snapshot import from_samples

    s = read_samples(samples) if isinstance(samples, str | Path) else normalise_samples(samples)
    j = read_jobs(jobs) if isinstance(jobs, str | Path) else normalise_jobs(jobs)
    names = named_hosts(j)
    s = s.assign(host=scheduler_names(s["host"], j, names))
    if len(s):
        spans = label_spans(s)
        check_job_clock(j, spans, float(s["ts"].min()), float(s["ts"].max()), policy.sweep.sample_interval)
        j, moved = labelled_starts(j, spans, float(s["ts"].min()), policy.sweep.sample_interval)
        if moved:
            logger.warning("%s", moved)
    window = s[(s["ts"] > now - policy.sweep.lookback) & (s["ts"] <= now)]
    problems = [] if len(window) else [f"trace has no samples in the {policy.sweep.lookback:g}s before {now:g}"]
    doubtful = numbering(s, j, now, policy)
    if doubtful:
        from gpu_cost.perceive.gpu_map import numbering_note

        # as a live sweep treats a node whose numbering disagrees (gpu_map.apply): its GPUs stale, the run degraded
        problems.append(f"gpu index check: {numbering_note(doubtful)}")
    return from_samples(policy=policy, now=now, source="trace", samples=window, jobs=jobs_at(j, s, now),
                        problems=problems, recorded=frozenset(j["job_id"]),
                        managed=managed_hosts(names, labelled_hosts(s, j)), doubtful=frozenset(doubtful))


def numbering(samples: pd.DataFrame, jobs: pd.DataFrame, now: float, policy: Any) -> dict[str, dict[int, int]]:
    """Return the nodes whose samples up to ``now`` agree with the jobs' ``gpu_ids`` only when renumbered
    (:func:`gpu_cost.perceive.gpu_map.trace_claims`)."""
    from gpu_cost.perceive.aggregate import to_dense
    from gpu_cost.perceive.gpu_map import trace_claims

    if "gpu_ids" not in jobs.columns or not len(samples):
        return {}
    keys, times, arrays = to_dense(samples, -math.inf, now)
    if len(times) < 2:
        return {}
    row_of = {(str(h), int(g)): i for i, (h, g) in enumerate(zip(keys["host"], keys["gpu"], strict=True))}
    ends = jobs["end_ts"] if "end_ts" in jobs.columns else pd.Series(math.nan, index=jobs.index)
    claims = []
    for text, start, end in zip(jobs["gpu_ids"], jobs["start_ts"], ends, strict=True):
        rows = [row_of[k] for k in parse_gpu_ids(text) if k in row_of]
        if rows and start == start:
            claims.append((rows, float(start), math.inf if end != end else float(end)))
    labelled = (arrays["job"] != "").any(axis=1)
    step = float(np.median(np.diff(times)))
    return trace_claims(keys["host"].astype(str).tolist(), keys["gpu"].astype(int).tolist(), times, arrays["util"],
                        labelled, claims, policy.sweep.busy_util, step)


def parse_gpu_ids(text: object, strict: bool = False) -> list[tuple[str, int]]:
    """Return the ``(host, GPU index)`` pairs of a jobs trace's ``gpu_ids``: ``host:idx`` items separated by
    commas, an index range as Slurm writes one (``gpu01:0-3``) read whole, ``gpu01:0,1`` as the host's 0 and 1,
    and a Slurm host list before the indices (``gpu[01-02]:0-3``, as ``scontrol show job -d`` pairs its
    ``Nodes=`` with ``IDX:``) as each of its hosts'. Items that name no index (``N/A``) are skipped; ``strict``:
    an item that cannot be read (``gpu01:gpu3``, an index without a host) raises ValueError naming it."""
    from gpu_cost.perceive.slurm import expand_hostlist, parse_index_list, split_top_level

    out: list[tuple[str, int]] = []
    hosts: list[str] = []
    raw = str(text or "")
    try:
        parts = split_top_level(raw)
    except ValueError:
        parts = raw.split(",")
    for part in parts:
        part = part.strip()
        if ":" in part:
            name, _, idx = part.rpartition(":")
            name, idx = name.strip(), idx.strip()
            try:
                hosts = expand_hostlist(name) if "[" in name else [name]
            except ValueError:
                hosts = []  # no host list: no host
        else:
            idx = part  # an index after a comma: the hosts before it
        if not hosts or not hosts[0] or not idx:
            if strict and part:
                raise ValueError(f"{part!r} names no host" if idx else f"{part!r} names no GPU index")
            continue
        try:
            found = parse_index_list(idx)
        except ValueError:
            if strict:
                raise ValueError(f"{part!r}: {idx!r} is no GPU index list (0, 0-3, 0,2)") from None
            continue
        out.extend((h, i) for h in hosts for i in found)
    return out


def _check_gpu_ids(values: pd.Series, source: str) -> None:
    """Refuse a ``gpu_ids`` cell that is not read whole, naming its row: read in part, a job's GPUs that a cell
    names unreadably would be nobody's, and an idle one's neighbour taken for a zombie or an idle allocation."""
    for v in values.unique().tolist():
        try:
            parse_gpu_ids(v, strict=True)
        except ValueError as exc:
            row = int(values.index[(values == v).to_numpy()][0])
            raise TraceError(f"{source}: column gpu_ids, row {row + 1}: {v!r} is not read whole ({exc}); write "
                             "host:index items, as gpu01:0-3,gpu02:0 or gpu[01-02]:0-3") from None


def named_hosts(jobs: pd.DataFrame) -> set[str]:
    """Return the hosts a jobs trace names, in ``gpu_ids`` and in ``nodes``: the scheduler's names for its nodes."""
    out: set[str] = set()
    if "gpu_ids" in jobs.columns:
        out.update(h for text in jobs["gpu_ids"].dropna().astype(str).unique() for h, _ in parse_gpu_ids(text))
    if "nodes" in jobs.columns:
        out.update(h for text in jobs["nodes"].dropna().astype(str).unique() for h in node_names(text))
    return out


def managed_hosts(names: AbstractSet[str], labelled: Iterable[str]) -> frozenset[str] | None:
    """Return the hosts a trace's scheduler runs jobs on: those its jobs file names (``names``:
    :func:`named_hosts`) and those the samples label with one of its jobs (``labelled``); None when the file names
    no node at all, which says nothing of which hosts are the scheduler's (:func:`gpu_cost.perceive.correlate.attribute`'s
    ``managed``: a host outside these is outside the scheduler)."""
    return frozenset(names) | frozenset(labelled) if names else None


def labelled_hosts(samples: pd.DataFrame, jobs: pd.DataFrame) -> list[str]:
    """Return the sampled hosts the exporter labels, at some time, with a job of ``jobs``."""
    if "job_id" not in samples.columns:
        return []
    mine = samples["job_id"].astype(str).isin(set(jobs["job_id"].astype(str)))
    return samples.loc[mine.to_numpy(), "host"].astype(str).unique().tolist()


def scheduler_names(hosts: pd.Series, jobs: pd.DataFrame, names: AbstractSet[str] | None = None) -> pd.Series:
    """Return the samples' ``host`` column with each host the jobs name otherwise (``gpu01`` for
    ``gpu01.cluster.example.org``) under that name (:func:`gpu_cost.perceive.correlate.host_names`)."""
    from gpu_cost.perceive.correlate import aliases, host_names

    text = hosts.astype(str)
    names = named_hosts(jobs) if names is None else names
    renamed = host_names(text.unique(), names)
    if renamed:
        logger.info("trace hosts read under the jobs' names for them: %s",
                    ", ".join(f"{a} as {b}" for a, b in sorted(renamed.items())[:5]))
        text = text.replace(renamed)
    second = sorted(aliases(text.unique(), names))
    if second:
        logger.warning("trace hosts that are a second name of a node the samples also name (judged by no rule): %s",
                       ", ".join(second[:5]))
    return text if renamed else hosts


__all__ = ["JOB_COLUMNS", "SAMPLE_COLUMNS", "jobs_at", "normalise_jobs", "normalise_samples", "read_jobs",
           "read_samples", "read_table", "snapshot"]
