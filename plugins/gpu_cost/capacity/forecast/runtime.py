"""Job end-time model: when will a job really end, given its class and what its class did lately.

A job's *class* is looked at on five levels, most specific first: (user, account, name template,
GPUs, time limit) → (user, account, GPUs, limit) → (account, GPUs, limit) → (GPUs, limit) →
(limit). Runtimes are modelled as the ratio ``runtime / time limit`` in (0, 1], so a prediction is
never above the limit.

**Empirical model (every class).** For each job, the recent history of the most specific level that
has any: the last 1, 3 and 10 ratios of jobs of that class that *finished before the job was
submitted* (medians), the share of the last 5 and 10 that ran into their limit, the limit and the
time since the class last finished a job. The conditional distribution of the ratio given those
features is read off the training jobs nearest in that feature space (k nearest neighbours): its
median is the point estimate, its 90th percentile the p90. Sparse classes thereby borrow from the
coarser level and from similar histories elsewhere (the shrinkage across the hierarchy); a class
with no history at any level gets the training set's distribution for its limit. A job that is
still running is forecast given how long it has run (only the similar jobs that ran longer count;
see :func:`predict`), so its likely end is never in the past.

**Prophet (classes with enough history over time).** A class with at least ``min_class_jobs``
training jobs over at least two weeks also gets a Prophet fit of its ratio over time (trend +
weekly seasonality, 80 % interval → p90). Both are scored on the class's last quarter of training
jobs (MAE + p90 pinball, each model fitted on what came before) and the better one is kept for the
class; :attr:`RuntimeModel.choices` records the choice and both scores.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_cost.capacity.forecast import prophet_util
from gpu_cost.capacity.forecast.history import finished, jobs_frame

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)

LEVELS: tuple[tuple[str, ...], ...] = (
    ("user", "account", "name_tpl", "gpus", "time_limit_s"),
    ("user", "account", "gpus", "time_limit_s"),
    ("account", "gpus", "time_limit_s"),
    ("gpus", "time_limit_s"),
    ("time_limit_s",),
)
LEVEL_NAMES = ("name", "user", "account", "gpus", "limit")
#: the level Prophet classes are formed on (user, account, GPUs, limit)
PROPHET_LEVEL = 1
HIST = 10
HIT = 0.98  # a ratio at or above this ran into its limit
Q = 0.9


def name_template(name: str) -> str:
    """Return a job name with its varying parts (numbers, hashes, dates) replaced by ``#``."""
    text = re.sub(r"[0-9a-f]{8,}", "#", str(name or "").lower())
    return re.sub(r"\d+", "#", text)


def class_key(row: Mapping[str, Any], level: int) -> str:
    """Return the class key of a job (mapping with the job columns) at ``level``."""
    parts = []
    for col in LEVELS[level]:
        v = row.get(col)
        if col == "name_tpl":
            v = name_template(row.get("name") or "")
        elif col in ("gpus", "time_limit_s"):
            v = "" if v is None or (isinstance(v, float) and math.isnan(v)) else int(float(v))
        parts.append(f"{col.split('_')[0]}={'' if v is None else v}")
    return f"{LEVEL_NAMES[level]}|" + "|".join(parts)


def _keys(df: pd.DataFrame, level: int) -> pd.Series:
    import pandas as pd

    cols = []
    for col in LEVELS[level]:
        if col == "name_tpl":
            s = df["name"].fillna("").astype(str).map(name_template)
        elif col in ("gpus", "time_limit_s"):
            s = pd.to_numeric(df[col], errors="coerce").map(lambda v: "" if pd.isna(v) else str(int(v)))
        else:
            s = df[col].fillna("").astype(str)
        cols.append(f"{col.split('_')[0]}=" + s)
    out = cols[0]
    for c in cols[1:]:
        out = out + "|" + c
    return f"{LEVEL_NAMES[level]}|" + out


def ratios(jobs: pd.DataFrame) -> np.ndarray:
    """Return runtime ÷ limit for finished jobs, in [0, 1] (a job killed at its limit counts as 1)."""
    import numpy as np

    rt = (jobs["end_ts"] - jobs["start_ts"]).to_numpy(dtype=float)
    lim = jobs["time_limit_s"].to_numpy(dtype=float)
    return np.clip(rt / lim, 0.0, 1.0)


# -- features ---------------------------------------------------------------------------------
def features(jobs: pd.DataFrame, history: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (X, level used, last end at that level) for ``jobs`` from ``history``.

    Only history jobs that ended before a job's ``submit_ts`` count (what was known when it was
    submitted). ``X`` columns: median of the last 1, 3, 10 ratios; share of the last 5 and 10 that
    hit their limit; log limit; log hours since the last end. Missing values are -1.
    """
    import numpy as np

    n = len(jobs)
    hist = finished(history)
    cut = jobs["submit_ts"].fillna(jobs["start_ts"]).to_numpy(dtype=float)
    last = np.full((n, HIST), np.nan)
    last_end = np.full(n, np.nan)
    level = np.full(n, -1, dtype=np.int64)
    h_end = hist["end_ts"].to_numpy(dtype=float)
    h_r = ratios(hist) if len(hist) else np.zeros(0)
    todo = np.ones(n, dtype=bool)
    for li in range(len(LEVELS)):
        if not todo.any() or hist.empty:
            break
        hk = _keys(hist, li).to_numpy()
        jk = _keys(jobs, li).to_numpy()
        groups: dict[str, np.ndarray] = {}
        order = np.lexsort((h_end, hk))
        hk_sorted = hk[order]
        bounds = np.flatnonzero(np.r_[True, hk_sorted[1:] != hk_sorted[:-1], True])
        for s, e in itertools.pairwise(bounds):
            groups[hk_sorted[s]] = order[s:e]
        for j in np.flatnonzero(todo):
            idx = groups.get(jk[j])
            if idx is None:
                continue
            ends = h_end[idx]
            k = int(np.searchsorted(ends, cut[j], side="left"))
            if k == 0:
                continue
            vals = h_r[idx[max(0, k - HIST):k]]
            last[j, HIST - len(vals):] = vals
            last_end[j] = ends[k - 1]
            level[j] = li
            todo[j] = False
    lim = jobs["time_limit_s"].to_numpy(dtype=float)
    gap_h = np.clip((cut - last_end) / 3600.0, 0, None)
    with np.errstate(all="ignore"):
        cnt5 = (~np.isnan(last[:, -5:])).sum(1)
        cnt10 = (~np.isnan(last)).sum(1)
        x = np.column_stack([
            last[:, -1],
            _nanmedian(last[:, -3:]),
            _nanmedian(last),
            np.where(cnt5 > 0, (last[:, -5:] >= HIT).sum(1) / np.maximum(cnt5, 1), np.nan),
            np.where(cnt10 > 0, (last >= HIT).sum(1) / np.maximum(cnt10, 1), np.nan),
            np.log(np.where(lim > 0, lim, np.nan)) / 3.0,
            np.log1p(gap_h) / 3.0,
        ])
    return np.where(np.isnan(x), -1.0, x), level, last_end


def _nanmedian(a: np.ndarray) -> np.ndarray:
    import numpy as np

    out = np.full(a.shape[0], np.nan)
    ok = (~np.isnan(a)).any(1)
    if ok.any():
        out[ok] = np.nanmedian(a[ok], axis=1)
    return out


# -- the model --------------------------------------------------------------------------------
@dataclass
class RuntimeModel:
    """A fitted end-time model.

    :param X: features of the training jobs; :param r: their runtime ratios.
    :param history: finished jobs the features are computed from (the fit's knowledge).
    :param prior: per time limit, the (p50, p90) ratio of the training jobs (no-history fallback).
    :param choices: per Prophet-eligible class: method chosen and the validation scores.
    :param prophet: class key → fitted Prophet model (only classes where Prophet won).
    """

    X: Any
    r: Any
    history: Any
    k: int
    prior: dict[int, tuple[float, float]]
    fitted_at: float
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)
    prophet: dict[str, Any] = field(default_factory=dict)
    stats: prophet_util.FitStats = field(default_factory=prophet_util.FitStats)

    @property
    def n_train(self) -> int:
        return len(self.r)

    def summary(self) -> dict[str, Any]:
        methods = [c["method"] for c in self.choices.values()]
        return {"n_train": self.n_train, "k": self.k, "prophet_candidates": len(methods),
                "prophet_classes": methods.count("prophet"), "empirical_classes": methods.count("empirical"),
                "prophet_fits": self.stats.fits, "prophet_failed": self.stats.failed}


#: a running job's end is read off at least this many similar jobs that ran at least as long
MIN_SURVIVORS = 5


def _knn_quantiles(Xtr: np.ndarray, rtr: np.ndarray, X: np.ndarray, k: int,
                   qs: Sequence[float] = (0.5, Q), floor: np.ndarray | None = None) -> np.ndarray:
    """Return, per row of ``X``, the quantiles ``qs`` of ``rtr`` over its ``k`` nearest training rows.

    ``floor`` (per row, NaN for none): a running job's elapsed ratio; only neighbours that ran
    longer count (the distribution given that the job is still running), and a row with fewer than
    :data:`MIN_SURVIVORS` of them is left NaN for the caller's fallback.
    """
    import numpy as np

    out = np.full((len(X), len(qs)), np.nan)
    if len(Xtr) == 0 or len(X) == 0:
        return out
    k = max(1, min(k, len(Xtr)))
    sq = (Xtr**2).sum(1)
    step = max(1, 4_000_000 // max(len(Xtr), 1))
    for s in range(0, len(X), step):
        xb = X[s:s + step]
        d = (xb**2).sum(1)[:, None] + sq[None, :] - 2.0 * xb @ Xtr.T
        nn = np.argpartition(d, k - 1, axis=1)[:, :k] if k < len(Xtr) else np.tile(np.arange(len(Xtr)), (len(xb), 1))
        vals = rtr[nn]
        if floor is None or np.isnan(floor[s:s + step]).all():
            out[s:s + step] = np.quantile(vals, qs, axis=1).T
            continue
        fb = floor[s:s + step]
        alive = np.isnan(fb)[:, None] | (vals > np.nan_to_num(fb, nan=-1.0)[:, None])
        enough = alive.sum(1) >= np.where(np.isnan(fb), 1, MIN_SURVIVORS)
        if enough.any():
            block = out[s:s + step]
            block[enough] = np.nanquantile(np.where(alive, vals, np.nan)[enough], qs, axis=1).T
    return out


def _survivor_quantiles(r: np.ndarray, floor: float) -> tuple[float, float] | None:
    """Return the (p50, p90) ratio of the ratios in ``r`` above ``floor``; None when none is."""
    import numpy as np

    alive = r[r > floor]
    if not len(alive):
        return None
    return float(np.quantile(alive, 0.5)), float(np.quantile(alive, Q))


def _prior(jobs: pd.DataFrame, r: np.ndarray) -> dict[int, tuple[float, float]]:
    import numpy as np

    out: dict[int, tuple[float, float]] = {}
    lim = jobs["time_limit_s"].to_numpy(dtype=float).astype(np.int64)
    for L in np.unique(lim):
        v = r[lim == L]
        if len(v):
            out[int(L)] = (float(np.quantile(v, 0.5)), float(np.quantile(v, Q)))
    if len(r):
        out[0] = (float(np.quantile(r, 0.5)), 1.0)
    return out


def fit(jobs: pd.DataFrame, *, now: float | None = None, k: int = 100, min_class_jobs: int = 30,
        min_span_days: float = 14.0, use_prophet: bool = True, max_train: int = 50_000) -> RuntimeModel:
    """Fit the end-time model on finished ``jobs`` (those ending by ``now`` when given)."""

    fin = finished(jobs, before=now)
    fin = fin.sort_values("end_ts").tail(max_train).reset_index(drop=True)
    fitted_at = float(now if now is not None else (fin["end_ts"].max() if len(fin) else 0.0))
    X, _, _ = features(fin, fin)
    r = ratios(fin)
    model = RuntimeModel(X=X, r=r, history=fin, k=_k(k, len(r)), prior=_prior(fin, r), fitted_at=fitted_at)
    if use_prophet and len(fin):
        _fit_prophet_classes(model, fin, min_class_jobs, min_span_days)
    logger.info("runtime model: %d training jobs, k=%d, %s", len(r), model.k,
                json.dumps({k2: v for k2, v in model.summary().items() if k2 not in ("n_train", "k")}))
    return model


def _k(k: int, n: int) -> int:
    return max(1, min(k, n // 3 if n >= 30 else n))


def predict(model: RuntimeModel, jobs: pd.DataFrame, history: pd.DataFrame | None = None,
            now: float | None = None) -> pd.DataFrame:
    """Return per job ``job_id, p50_s, p90_s, method, level, class`` (runtimes, capped at the limit).

    ``history`` (default: the model's) is what the features may look at; only jobs finished before
    each job's submit time count. Jobs without a time limit get no prediction (NaN).

    ``now``: a job that started before it is still running, so its runtime is at least what it has
    run: its quantiles are those of the similar jobs that ran longer (its neighbours; too few of
    them: the training jobs of its limit; none at all: it is expected to run to its limit, method
    ``limit``). Prophet's class quantiles are kept only while the job has run less than their median.
    Without ``now`` (a job at submit, as the backtest scores it) nothing is conditioned.
    """
    import numpy as np
    import pandas as pd

    hist = model.history if history is None else history
    X, level, _ = features(jobs, hist)
    lim = jobs["time_limit_s"].to_numpy(dtype=float)
    floor = np.full(len(jobs), np.nan)
    if now is not None:
        start = jobs["start_ts"].to_numpy(dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            ran = np.clip((now - start) / lim, 0.0, 1.0)
        floor = np.where((start == start) & (start < now) & (lim > 0), ran, np.nan)
    q = _knn_quantiles(model.X, model.r, X, model.k, floor=floor)
    method = np.where(level >= 0, "empirical", "prior").astype(object)
    none = level < 0
    if none.any():
        for i in np.flatnonzero(none):
            L = lim[i]
            pr = model.prior.get(int(L)) if L == L else None
            q[i] = pr if pr is not None else model.prior.get(0, (0.5, 1.0))
    running = np.flatnonzero(floor == floor)
    if len(running):
        train_lim = model.history["time_limit_s"].to_numpy(dtype=float) if len(model.r) else np.array([])
        for i in running:
            if level[i] >= 0 and q[i, 0] == q[i, 0]:
                continue  # enough neighbours ran longer
            same = model.r[train_lim == lim[i]]
            qi = _survivor_quantiles(same, floor[i]) if (same > floor[i]).sum() >= MIN_SURVIVORS else None
            qi = qi or _survivor_quantiles(model.r, floor[i])
            if qi is None:
                q[i], method[i] = (1.0, 1.0), "limit"
            else:
                q[i], method[i] = qi, "prior"
    pkey = _keys(jobs, PROPHET_LEVEL).to_numpy() if model.prophet else None
    if pkey is not None:
        for key, m in model.prophet.items():
            idx = np.flatnonzero(pkey == key)
            if len(idx):
                pq = _prophet_quantiles(m, jobs["submit_ts"].fillna(jobs["start_ts"]).to_numpy(dtype=float)[idx])
                keep = ~(floor[idx] >= np.clip(pq[:, 0], 0.0, 1.0))  # not yet past Prophet's median
                q[idx[keep]] = pq[keep]
                method[idx[keep]] = "prophet"
    q = np.clip(q, 0.0, 1.0)
    if len(running):
        q[running] = np.maximum(q[running], floor[running, None])  # never before now
    q[:, 1] = np.maximum(q[:, 1], q[:, 0])
    return pd.DataFrame({
        "job_id": jobs["job_id"].astype(str).to_numpy(), "p50_s": q[:, 0] * lim, "p90_s": q[:, 1] * lim,
        "method": method, "level": [LEVEL_NAMES[i] if i >= 0 else "none" for i in level],
    })


# -- Prophet per class ------------------------------------------------------------------------
def _prophet_frame(ts: np.ndarray, r: np.ndarray) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({"ds": pd.to_datetime(ts, unit="s"), "y": r})


def _prophet_quantiles(m: Any, ts: np.ndarray) -> np.ndarray:
    import numpy as np
    import pandas as pd

    fc = prophet_util.predict(m, pd.DataFrame({"ds": pd.to_datetime(ts, unit="s")}))
    return np.column_stack([fc["yhat"].to_numpy(), fc["yhat_upper"].to_numpy()])


def _prophet_kwargs() -> dict[str, Any]:
    return {"daily_seasonality": False, "weekly_seasonality": True, "yearly_seasonality": False,
            "interval_width": 2 * Q - 1, "uncertainty_samples": 200, "changepoint_prior_scale": 0.05}


def _score(y: np.ndarray, q50: np.ndarray, q90: np.ndarray) -> float:
    import numpy as np

    pin = np.where(y > q90, Q * (y - q90), (1 - Q) * (q90 - y))
    return float(np.mean(np.abs(y - q50)) + np.mean(pin))


def _fit_prophet_classes(model: RuntimeModel, fin: pd.DataFrame, min_jobs: int, min_span_days: float) -> None:
    """Fit Prophet where a class has enough history over time; keep it where it beats the empirical model."""
    import numpy as np

    prophet_util.silence()
    keys = _keys(fin, PROPHET_LEVEL).to_numpy()
    ts = fin["submit_ts"].fillna(fin["start_ts"]).to_numpy(dtype=float)
    lim = fin["time_limit_s"].to_numpy(dtype=float)
    r = model.r
    uniq, counts = np.unique(keys, return_counts=True)
    eligible = [u for u, c in zip(uniq, counts, strict=False) if c >= min_jobs]
    eligible = [u for u in eligible if np.ptp(ts[keys == u]) >= min_span_days * 86400]
    if not eligible:
        return
    # a common validation cut: every model scored on jobs submitted after it, fitted on those ending before
    cut = float(np.quantile(ts, 0.75))
    before = fin["end_ts"].to_numpy(dtype=float) < cut
    # each validation job's features see what had finished before it was submitted, as in use
    Xv = model.X
    for key in eligible:
        m_cls = keys == key
        tr = m_cls & before
        va = m_cls & (ts >= cut)
        if tr.sum() < max(10, min_jobs // 2) or va.sum() < 5:
            model.choices[key] = {"method": "empirical", "n": int(m_cls.sum()), "why": "too few jobs around the cut"}
            continue
        pm = prophet_util.fit(_prophet_frame(ts[tr], r[tr]), model.stats, **_prophet_kwargs())
        if pm is None:
            model.choices[key] = {"method": "empirical", "n": int(m_cls.sum()), "why": "prophet fit failed"}
            continue
        qp = np.clip(_prophet_quantiles(pm, ts[va]), 0, 1)
        qe = _knn_quantiles(Xv[before], r[before], Xv[va], _k(model.k, int(before.sum())))
        y = r[va] * lim[va]
        sp = _score(y, qp[:, 0] * lim[va], np.maximum(qp[:, 1], qp[:, 0]) * lim[va])
        se = _score(y, qe[:, 0] * lim[va], qe[:, 1] * lim[va])
        choice = {"n": int(m_cls.sum()), "score_prophet_s": round(sp, 1), "score_empirical_s": round(se, 1)}
        if sp < 0.98 * se:
            full = prophet_util.fit(_prophet_frame(ts[m_cls], r[m_cls]), model.stats, **_prophet_kwargs())
            if full is not None:
                model.prophet[key] = full
                model.choices[key] = {"method": "prophet", **choice}
                continue
        model.choices[key] = {"method": "empirical", **choice}
    logger.info("%s", model.stats.summary("runtime-class"))


# -- using the model: stored rows and predicted ends -------------------------------------------
def class_rows(model: RuntimeModel, now: float) -> list[dict[str, Any]]:
    """Return one ``gpu_cost_forecasts`` row per class (every level) as of ``now``.

    ``yhat`` / ``yhat_upper`` are the p50 / p90 *ratios* of the limit for a job of that class
    submitted at ``now``; ``extra`` carries the level, the method and the recent history size.
    """
    import numpy as np

    hist = model.history
    if hist.empty:
        return []
    rows = []
    seen: set[str] = set()
    for li in range(len(LEVELS)):
        keys = _keys(hist, li)
        first = ~keys.duplicated(keep="last")
        reps = hist[first.to_numpy()].copy()
        reps["submit_ts"] = now
        reps["start_ts"] = now
        k_arr = keys[first].to_numpy()
        pr = predict(model, reps, hist)
        lim = reps["time_limit_s"].to_numpy(dtype=float)
        with np.errstate(all="ignore"):
            q50 = pr["p50_s"].to_numpy() / lim
            q90 = pr["p90_s"].to_numpy() / lim
        for i, key in enumerate(k_arr):
            if key in seen:
                continue
            seen.add(key)
            choice = model.choices.get(key, {})
            rows.append({
                "series": f"runtime:class:{key}", "horizon_ts": now, "kind": "runtime",
                "yhat": _r(q50[i]), "yhat_lower": None, "yhat_upper": _r(q90[i]),
                "model": str(pr["method"].iloc[i]), "created_at": now,
                "extra": json.dumps({"level": LEVEL_NAMES[li], "unit": "ratio of time limit",
                                     "choice": choice or None}),
            })
    return rows


def _r(v: float) -> float | None:
    return None if v != v else round(float(v), 5)


def job_rows(model: RuntimeModel, jobs: pd.DataFrame, now: float) -> list[dict[str, Any]]:
    """Return one row per running job: series ``runtime:job:<id>``, keyed by its start (one row a job).

    ``yhat`` / ``yhat_upper`` are the p50 / p90 end instants (epoch seconds); ``extra`` repeats the
    p90 end as ``p90_end`` with the method.
    """
    run = jobs[jobs["start_ts"].notna() & jobs["end_ts"].isna() & (jobs["time_limit_s"].fillna(0) > 0)]
    if run.empty:
        return []
    pr = predict(model, run, now=now)
    out = []
    for (_, job), (_, p) in zip(run.iterrows(), pr.iterrows(), strict=False):
        start = float(job["start_ts"])
        out.append({
            "series": f"runtime:job:{job['job_id']}", "horizon_ts": start, "kind": "runtime",
            "yhat": round(start + float(p["p50_s"]), 1), "yhat_lower": start,
            "yhat_upper": round(start + float(p["p90_s"]), 1), "model": str(p["method"]), "created_at": now,
            "extra": json.dumps({"p50_end": round(start + float(p["p50_s"]), 1),
                                 "p90_end": round(start + float(p["p90_s"]), 1), "level": p["level"],
                                 "limit_end": start + float(job["time_limit_s"])}),
        })
    return out


def predicted_ends(store_or_model: AuditStore | RuntimeModel, jobs: Iterable[Any], now: float) -> dict[str, float]:
    """Return ``{job_id: p90 end (epoch seconds)}`` for the running jobs among ``jobs``.

    ``store_or_model``: a fitted :class:`RuntimeModel`, or the audit store holding the nightly
    forecasts (a job's own ``runtime:job:<id>`` row, else its class rows, most specific level
    first, from the newest nightly run of the last 8 days). ``jobs``: :class:`gpu_cost.core.model.Job`
    objects or mappings with the job columns. A job with no start, no time limit or no forecast is
    left out; an end is never after start + limit.
    """
    started = [j for j in jobs if (j.get("start_ts") if isinstance(j, Mapping) else getattr(j, "start_ts", None))
               is not None]
    frame = jobs_frame(started, "predicted_ends")
    if frame.empty:
        return {}
    run = frame[frame["start_ts"].notna() & (frame["time_limit_s"].fillna(0) > 0)]
    if isinstance(store_or_model, RuntimeModel):
        pr = predict(store_or_model, run, now=now)
        return {str(j): float(s) + min(float(p), float(lim)) for j, s, p, lim in
                zip(run["job_id"], run["start_ts"], pr["p90_s"], run["time_limit_s"], strict=False) if p == p}
    return _ends_from_store(store_or_model, run, now)


def _latest(rows: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        cur = out.get(row["series"])
        if cur is None or row["horizon_ts"] > cur["horizon_ts"]:
            out[row["series"]] = row
    return out


def _series_rows(store: AuditStore, series: Iterable[str], since: float) -> list[dict[str, Any]]:
    """Return the newest run's rows of each named series with a horizon at or after ``since`` (by the series' key:
    the store keeps a series per job ever forecast, and a sweep needs its running jobs' and their classes')."""
    names = sorted(set(series))
    rows: list[dict[str, Any]] = []
    for i in range(0, len(names), 500):
        rows += store.fetch("forecasts_of_series", {"series": names[i:i + 500], "since": since})
    return rows


def class_series(job: Mapping[str, Any]) -> list[str]:
    """Return the class series of a job (mapping with the job columns), most specific level first."""
    return [f"runtime:class:{class_key(job, li)}" for li in range(len(LEVELS))]


def stored_class_rows(store: AuditStore, now: float, series: Iterable[str]) -> dict[str, Mapping[str, Any]]:
    """Return the newest row of each of these class series, from nightly runs of the 8 days before ``now``."""
    rows = _series_rows(store, series, now - 8 * 86400)
    return _latest(r for r in rows if r["horizon_ts"] <= now + 1)


def _ends_from_store(store: AuditStore, run: pd.DataFrame, now: float) -> dict[str, float]:
    if run.empty:
        return {}
    jobs = [job.to_dict() for _, job in run.iterrows()]
    series_of = [class_series(row) for row in jobs]  # each job's class series, most specific first
    classes = stored_class_rows(store, now, (s for names in series_of for s in names))
    # one query for every running job's own row (keyed by its start), not one per job
    since = float(run["start_ts"].min()) - 1
    own_rows = {r["series"]: r for r in _series_rows(store, (f"runtime:job:{row['job_id']}" for row in jobs), since)
                if r.get("yhat_upper") is not None}
    out: dict[str, float] = {}
    for row, names in zip(jobs, series_of, strict=True):
        jid = str(row["job_id"])
        start, lim = float(row["start_ts"]), float(row["time_limit_s"])
        own = own_rows.get(f"runtime:job:{jid}")
        if own is not None and abs(float(own["horizon_ts"]) - start) < 1:
            out[jid] = min(float(own["yhat_upper"]), start + lim)
            continue
        for name in names:
            c = classes.get(name)
            if c is not None and c.get("yhat_upper") is not None:
                out[jid] = start + min(float(c["yhat_upper"]), 1.0) * lim
                break
    return out


def eta(store: AuditStore, job: Mapping[str, Any], now: float) -> dict[str, Any] | None:
    """Return the stored p50 / p90 end of a running job, with how it was found; None if none is known."""
    start = job.get("start_ts")
    lim = job.get("time_limit_s")
    if start is None or not lim:
        return None
    start, lim = float(start), float(lim)
    jid = str(job["job_id"])
    own = _series_rows(store, [f"runtime:job:{jid}"], start - 1)
    if own:
        r = own[-1]
        return {"job_id": jid, "p50_end": min(float(r["yhat"]), start + lim),
                "p90_end": min(float(r["yhat_upper"]), start + lim), "limit_end": start + lim,
                "basis": f"job forecast ({r['model']})", "forecast_made": r["created_at"]}
    names = class_series(job)
    classes = stored_class_rows(store, now, names)
    for li, name in enumerate(names):
        c = classes.get(name)
        if c is not None and c.get("yhat") is not None:
            return {"job_id": jid, "p50_end": start + float(c["yhat"]) * lim,
                    "p90_end": start + min(float(c["yhat_upper"] or 1.0), 1.0) * lim, "limit_end": start + lim,
                    "basis": f"class {LEVEL_NAMES[li]} ({c['model']})", "forecast_made": c["created_at"]}
    return None
