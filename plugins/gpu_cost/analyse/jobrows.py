"""The rows of a GPU frame per attributed job, and per-job reductions of its columns in one pass.

The rules and the replica sets judge each running job on its rows; most jobs fail a plain test (a
GPU busy, stale or missing), which :meth:`JobRows.any` and :meth:`JobRows.count` answer for every
job at once, so the per-job Python work is left to the few candidates.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpu_cost.core.model import Snapshot


class JobRows:
    """The rows of a GPU frame per attributed job, and per-job reductions of a column in one pass.

    :param frame: a GPU frame with ``job_id`` (None, NaN or "" for a row of no job).
    """

    def __init__(self, frame: pd.DataFrame) -> None:
        ids = frame["job_id"].to_numpy(dtype=object)
        codes, uniques = pd.factorize(ids, use_na_sentinel=True)
        blank = [k for k, u in enumerate(uniques) if u == ""]
        if blank:  # "" is no job, as None is
            codes = np.where(np.isin(codes, blank), -1, codes)
        self._codes = codes
        self._rows_of = np.flatnonzero(codes >= 0)
        self._n = len(uniques)
        #: the rows of a job, job after job (each job's rows in frame order), and where each job's rows start
        self._order = self._rows_of[np.argsort(codes[self._rows_of], kind="stable")]
        counts = np.bincount(codes[self._rows_of], minlength=self._n)
        ends = np.cumsum(counts)
        self._counts = counts
        self._starts = ends - counts
        self.code: dict[str, int] = {}
        self.rows: dict[str, np.ndarray] = {}
        for k, u in enumerate(uniques):
            if counts[k]:
                key = str(u)
                self.code[key] = k
                self.rows[key] = self._order[ends[k] - counts[k]:ends[k]]

    def rows_of_code(self, code: int) -> np.ndarray:
        """Return the rows of the job of ``code``, in frame order."""
        return self._order[self._starts[code]:self._starts[code] + self._counts[code]]

    def sizes(self) -> np.ndarray:
        """Return, per job code, how many rows the job has."""
        return self._counts

    def count(self, mask: np.ndarray) -> np.ndarray:
        """Return, per job code, how many of its rows ``mask`` holds."""
        return np.bincount(self._codes[self._rows_of], weights=np.asarray(mask, dtype=bool)[self._rows_of],
                           minlength=self._n).astype(np.int64)

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Return, per job code, the sum of its rows' ``values``, added one row after another in frame order."""
        return np.bincount(self._codes[self._rows_of], weights=np.asarray(values, dtype=float)[self._rows_of],
                           minlength=self._n)

    def any(self, mask: np.ndarray) -> np.ndarray:
        """Return, per job code, whether ``mask`` holds any of its rows."""
        return self.count(mask) > 0

    def nanmean(self, values: np.ndarray) -> np.ndarray:
        """Return, per job code, the mean of its rows' ``values`` that are not NaN (NaN when none is): a prefilter,
        equal to ``np.nanmean`` over the job's rows up to the last bits of rounding."""
        v = np.asarray(values, dtype=float)[self._rows_of]
        ok = ~np.isnan(v)
        codes = self._codes[self._rows_of]
        n = np.bincount(codes, weights=ok, minlength=self._n)
        total = np.bincount(codes, weights=np.where(ok, v, 0.0), minlength=self._n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, total / n, np.nan)

    def reduce(self, ufunc: np.ufunc, values: np.ndarray) -> np.ndarray:
        """Return, per job code, ``ufunc`` reduced over its rows' ``values`` (NaN for a code with no rows).

        ``values`` has a value per row, or a row of values per row (rows × k: the result is codes × k, each
        column reduced on its own). For an exact reduction (``np.maximum``: ``np.max``, NaN when one is NaN;
        ``np.fmax``: ``np.nanmax``, NaN when all are; ``np.minimum``, ``np.fmin``) it equals the per-job NumPy
        call to the last bit.
        """
        v = np.asarray(values, dtype=float)
        out = np.full((self._n, *v.shape[1:]), np.nan)
        has = self._counts > 0
        if has.any():
            out[has] = ufunc.reduceat(v[self._order], self._starts[has], axis=0)
        return out

    def median(self, values: np.ndarray) -> np.ndarray:
        """Return, per job code, the median of its rows' ``values``: ``np.median`` over the job's rows, exactly
        (the middle value, or the mean of the two middle ones; NaN when one is NaN or the code has no rows)."""
        v = np.asarray(values, dtype=float)[self._order]
        codes = self._codes[self._order]
        out = np.full(self._n, np.nan)
        if not len(v):
            return out
        ranked = v[np.lexsort((v, codes))]  # each job's values ascending, jobs in the same order as _order
        n = self._counts
        has = n > 0
        lo = self._starts + (n - 1) // 2
        hi = self._starts + n // 2
        with np.errstate(invalid="ignore"):
            mid = np.where(n % 2 == 1, ranked[np.where(has, lo, 0)], (ranked[np.where(has, lo, 0)]
                                                                       + ranked[np.where(has, hi, 0)]) / 2)
        out[has] = mid[has]
        out[self.any(np.isnan(np.asarray(values, dtype=float)))] = np.nan
        return out


def job_index(snapshot: Snapshot) -> JobRows:
    """Return the :class:`JobRows` of ``snapshot.gpus``, built once per frame: every window's view has its rows."""
    index: JobRows = snapshot.memo("job_rows", snapshot.gpus, lambda: JobRows(snapshot.gpus))
    return index
