"""History for the forecasts: finished jobs, and hourly demand series built from jobs.

Jobs come from a trace file (CSV / Parquet in the design's jobs format), from Slurm accounting
(``gpu_cost.perceive.slurm``), from the agent's own per-sweep job rows in the audit store, or from
the simulator. Whatever the origin, the result is one DataFrame with the columns of
:data:`JOB_COLUMNS`: times as float epoch seconds, ``gpus`` the GPUs the job asked for, ``user`` /
``account`` / ``partition`` / ``name`` as text ('' when unknown).

A demand series is ``ts, key, value``: for each hour starting at ``ts``, the mean number of GPUs
running plus pending in that key (``account:<name>``, ``partition:<name>``, ``cluster:all``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cost.core.errors import TraceError

if TYPE_CHECKING:
    import pandas as pd

    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)

JOB_COLUMNS = ("job_id", "user", "account", "partition", "name", "state", "submit_ts", "start_ts", "end_ts",
               "time_limit_s", "gpus")
SERIES_COLUMNS = ("ts", "key", "value")
#: dimensions a demand series is keyed by, and the job column each reads
DIMENSIONS = {"account": "account", "partition": "partition", "user": "user"}
HOUR = 3600.0


def _read_table(path: str | Path, what: str) -> pd.DataFrame:
    import pandas as pd

    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: {what} file not found")
    try:
        if p.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(p)
        return pd.read_csv(p, dtype={"job_id": str, "user": str, "account": str, "partition": str, "name": str,
                                     "key": str})
    except (OSError, ValueError) as exc:
        raise TraceError(f"{p}: cannot read {what}: {exc}") from None


def _times(values: pd.Series, where: str) -> pd.Series:
    """Return float epoch seconds from epoch numbers or ISO 8601 text (NaN stays NaN)."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(values):
        return values.astype(float)
    num = pd.to_numeric(values, errors="coerce")
    text = values.where(num.isna() & values.notna())
    if text.notna().any():
        try:
            parsed = pd.to_datetime(text, utc=True, format="ISO8601")
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{where}: not ISO 8601 or epoch seconds: {exc}") from None
        secs = (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
        num = num.where(num.notna(), secs)
    return num.astype(float)


def normalise_jobs(df: pd.DataFrame, source: str = "<jobs>") -> pd.DataFrame:
    """Return ``df`` in the forecast's job layout; raise TraceError naming the source and column."""
    import pandas as pd

    missing = [c for c in ("job_id", "user", "start_ts") if c not in df.columns]
    if missing:
        raise TraceError(f"{source}: jobs trace lacks required column(s) {missing} (need job_id, user, start_ts)")
    out = pd.DataFrame(index=df.index)
    out["job_id"] = df["job_id"].astype(str)
    for col in ("user", "account", "partition", "name", "state"):
        out[col] = df[col].fillna("").astype(str) if col in df.columns else ""
    for col in ("submit_ts", "start_ts", "end_ts"):
        out[col] = _times(df[col], f"{source}: column {col}") if col in df.columns else float("nan")
    out["submit_ts"] = out["submit_ts"].fillna(out["start_ts"])
    out["time_limit_s"] = pd.to_numeric(df["time_limit_s"], errors="coerce") if "time_limit_s" in df.columns else float("nan")
    gpus = pd.to_numeric(df["gpus"], errors="coerce") if "gpus" in df.columns else pd.Series(1.0, index=df.index)
    out["gpus"] = gpus.fillna(1).clip(lower=0).astype(int)
    bad = out["start_ts"].isna() & ~out["state"].str.upper().isin(["PENDING", "PD"])
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise TraceError(f"{source}: row {row + 1}: start_ts is empty or unreadable for a job that is not pending")
    from gpu_cost.perceive.trace import check_limits

    check_limits(out, source)  # limits in minutes: the replay's reader refuses them too
    return out.reset_index(drop=True)


def load_jobs(path: str | Path) -> pd.DataFrame:
    """Read a jobs trace (CSV or Parquet) into the forecast's job layout."""
    return normalise_jobs(_read_table(path, "jobs trace"), str(path))


def finished(jobs: pd.DataFrame, *, before: float | None = None) -> pd.DataFrame:
    """Return the jobs that ended (by ``before`` when given) with a usable time limit."""
    ok = jobs["end_ts"].notna() & jobs["start_ts"].notna() & (jobs["end_ts"] >= jobs["start_ts"])
    ok &= jobs["time_limit_s"].fillna(0) > 0
    if before is not None:
        ok &= jobs["end_ts"] <= before
    return jobs[ok].reset_index(drop=True)


def slurm_jobs(since: float, until: float) -> pd.DataFrame | None:
    """Return finished jobs from Slurm accounting, or None when the Slurm source is not available."""
    try:
        from gpu_cost.perceive.slurmrestd import default_source
    except ImportError:
        logger.info("no Slurm source in this installation: history from another origin")
        return None
    raw = default_source().finished_jobs(since, until)
    rows = [_job_dict(j) for j in raw] if not hasattr(raw, "columns") else raw
    import pandas as pd

    return normalise_jobs(pd.DataFrame(rows) if not hasattr(rows, "columns") else rows, "slurm accounting")


def _job_dict(job: Any) -> dict[str, Any]:
    """Return a trace row for a :class:`gpu_cost.core.model.Job` (or a mapping)."""
    if isinstance(job, dict):
        return job
    return {
        "job_id": job.job_id, "user": job.user, "account": job.account, "partition": job.partition, "name": job.name,
        "state": job.state, "submit_ts": job.submit_ts, "start_ts": job.start_ts, "end_ts": job.end_ts,
        "time_limit_s": job.time_limit_s, "gpus": job.gpu_count,
    }


def jobs_frame(jobs: Iterable[Any], source: str = "<jobs>") -> pd.DataFrame:
    """Return the job layout for :class:`gpu_cost.core.model.Job` objects or mappings."""
    import pandas as pd

    rows = [_job_dict(j) for j in jobs]
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=float if c.endswith("_ts") or c == "time_limit_s" else object)
                             for c in JOB_COLUMNS})
    return normalise_jobs(pd.DataFrame(rows), source)


def store_jobs(store: AuditStore, since: float, until: float) -> pd.DataFrame:
    """Return jobs the agent itself saw (per-sweep job rows); a job ends at its last sighting.

    A job still seen at ``until`` is running and has no end. Empty when the store keeps no job rows.
    """
    import pandas as pd

    from gpu_cost.core.errors import AuditError

    try:
        rows = store.fetch("job_usage_between", {"since": since, "until": until, "min_gpus": 0})
    except AuditError as exc:
        logger.warning("per-sweep job rows could not be read from the audit store: %s", exc)
        rows = []
    if not rows:
        return jobs_frame([])
    df = pd.DataFrame(rows)
    last_sweep = float(df["ts"].max())
    g = df.sort_values("ts").groupby("job_id")
    out = g.agg(user=("user_name", "last"), account=("account", "last"), partition=("partition_name", "last"),
                name=("job_name", "last"), start_ts=("start_ts", "first"), time_limit_s=("time_limit_s", "last"),
                gpus=("gpus_requested", "max"), first_seen=("ts", "min"), last_seen=("ts", "max")).reset_index()
    out["start_ts"] = out["start_ts"].fillna(out["first_seen"])
    out["end_ts"] = out["last_seen"].where(out["last_seen"] < last_sweep)
    out["state"] = out["end_ts"].map(lambda e: "RUNNING" if pd.isna(e) else "COMPLETED")
    out["submit_ts"] = out["start_ts"]
    return normalise_jobs(out, "audit store job rows")


# -- demand series ----------------------------------------------------------------------------
def demand_series(
    jobs: pd.DataFrame,
    start: float,
    end: float,
    by: Sequence[str] = ("account", "partition"),
    *,
    total: bool = True,
) -> pd.DataFrame:
    """Return hourly demand (mean GPUs running + pending) per key over ``[start, end)``.

    A job is pending from ``submit_ts`` to ``start_ts`` and running from ``start_ts`` to ``end_ts``
    (or to ``end`` when it has not ended): together, from submit to end. Keys are ``<dim>:<value>``
    for each dimension in ``by`` (empty values are ``<dim>:-``), plus ``cluster:all`` when ``total``.
    """
    import numpy as np
    import pandas as pd

    for dim in by:
        if dim not in DIMENSIONS:
            raise TraceError(f"demand series: unknown dimension {dim!r} (use one of {sorted(DIMENSIONS)})")
    t0 = math.floor(start / HOUR) * HOUR
    n = max(0, math.ceil((end - t0) / HOUR))
    grid = t0 + np.arange(n) * HOUR
    if n == 0 or jobs.empty:
        return pd.DataFrame({"ts": pd.Series(dtype=float), "key": pd.Series(dtype=str), "value": pd.Series(dtype=float)})
    a = jobs["submit_ts"].fillna(jobs["start_ts"]).to_numpy(dtype=float)
    b = jobs["end_ts"].fillna(end).to_numpy(dtype=float)
    a = np.clip(a, t0, t0 + n * HOUR)
    b = np.clip(b, t0, t0 + n * HOUR)
    gpus = jobs["gpus"].to_numpy(dtype=float)
    keep = (b > a) & (gpus > 0) & ~np.isnan(a)
    labels: list[tuple[list[str], np.ndarray]] = []
    if total:
        labels.append((["cluster:all"], np.zeros(len(jobs), dtype=np.int64)))
    for dim in by:
        vals = jobs[DIMENSIONS[dim]].fillna("").astype(str).replace("", "-").to_numpy()
        codes, uniq = pd.factorize(vals)
        labels.append(([f"{dim}:{u}" for u in uniq], codes))
    frames = []
    for names, codes in labels:
        acc = _hourly_overlap(a[keep], b[keep], gpus[keep], codes[keep], len(names), t0, n)
        for i, name in enumerate(names):
            frames.append(pd.DataFrame({"ts": grid, "key": name, "value": np.round(acc[i], 4)}))
    return pd.concat(frames, ignore_index=True)


def _hourly_overlap(a: Any, b: Any, w: Any, codes: Any, k: int, t0: float, n: int) -> Any:
    """Return a ``k`` by ``n`` matrix: per code, the weight-seconds of ``[a, b)`` in each hour ÷ 3600."""
    import numpy as np

    out = np.zeros((k, n + 1))
    if len(a) == 0:
        return out[:, :n]
    # integral of a step function: cumulative GPU-seconds at each hour edge, from a difference array
    # over positions in fractional hours (exact fractional overlap, vectorised)
    fa = (a - t0) / HOUR
    fb = (b - t0) / HOUR
    edges = np.arange(n + 1, dtype=float)
    for code in range(k):
        m = codes == code
        if not m.any():
            continue
        sa, sb, sw = fa[m], fb[m], w[m]
        # G(x) = sum w * clip(x - a, 0, b - a): cumulative GPU-hours up to x
        order_a = np.argsort(sa)
        order_b = np.argsort(sb)
        ca = np.concatenate([[0], np.cumsum(sw[order_a])])
        cwa = np.concatenate([[0], np.cumsum((sw * sa)[order_a])])
        cb = np.concatenate([[0], np.cumsum(sw[order_b])])
        cwb = np.concatenate([[0], np.cumsum((sw * sb)[order_b])])
        ia = np.searchsorted(sa[order_a], edges, side="right")
        ib = np.searchsorted(sb[order_b], edges, side="right")
        g = (ca[ia] * edges - cwa[ia]) - (cb[ib] * edges - cwb[ib])
        out[code] = g
    return np.diff(out, axis=1)


def load_series(path: str | Path) -> pd.DataFrame:
    """Read a demand series file (``ts, key, value``); times as ISO 8601 or epoch seconds."""
    import pandas as pd

    df = _read_table(path, "series")
    missing = [c for c in SERIES_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{path}: series file lacks column(s) {missing} (need ts, key, value)")
    out = pd.DataFrame({"ts": _times(df["ts"], f"{path}: column ts"), "key": df["key"].astype(str),
                        "value": pd.to_numeric(df["value"], errors="coerce")})
    if out["ts"].isna().any():
        raise TraceError(f"{path}: row {int(out['ts'].isna().to_numpy().nonzero()[0][0]) + 1}: ts is empty")
    return out.sort_values(["key", "ts"]).reset_index(drop=True)
