"""Per-job reductions over a GPU frame's rows: each equals NumPy's per-job call to the last bit."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpu_cost.analyse.jobrows import JobRows


def _same(a: float, b: float) -> bool:
    return bool(np.float64(a).tobytes() == np.float64(b).tobytes()) or (np.isnan(a) and np.isnan(b))


def test_every_reduction_equals_numpy_over_each_jobs_rows() -> None:
    rng = np.random.default_rng(7)
    n = 4000
    ids = rng.choice(np.array(["", None, np.nan, *[str(i) for i in range(700)]], dtype=object), size=n)
    values = rng.uniform(0, 80000, n) * rng.choice([1.0, 1 / 3, 0.1], size=n)
    values[rng.random(n) < 0.05] = np.nan
    index = JobRows(pd.DataFrame({"job_id": ids}))
    checks = {"max": (index.reduce(np.maximum, values), np.max), "nanmax": (index.reduce(np.fmax, values), np.nanmax),
              "nanmin": (index.reduce(np.fmin, values), np.nanmin), "median": (index.median(values), np.median)}
    sizes = index.sizes()
    seen = {1: 0, 2: 0, "odd": 0, "even": 0}
    with np.errstate(invalid="ignore"):
        import warnings

        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own warnings for an all-NaN job
        for job, rows in index.rows.items():
            code = index.code[job]
            assert sizes[code] == len(rows)
            for name, (got, fn) in checks.items():
                assert _same(got[code], float(fn(values[rows]))), (name, job, values[rows])
            seen[len(rows)] = seen.get(len(rows), 0) + 1
            seen["odd" if len(rows) % 2 else "even"] += 1
    assert seen[1] and seen[2] and seen["odd"] and seen["even"]  # every shape of median was compared
    assert set(index.rows) <= {str(i) for i in range(700)}  # "", None and NaN are no job


def test_an_empty_frame_has_no_jobs() -> None:
    index = JobRows(pd.DataFrame({"job_id": pd.Series([], dtype=object)}))
    assert index.rows == {} and len(index.median(np.zeros(0))) == 0 and len(index.reduce(np.maximum, np.zeros(0))) == 0


def test_a_jobs_sum_adds_its_rows_one_after_another_in_frame_order() -> None:
    rng = np.random.default_rng(11)
    n = 3000
    ids = rng.choice(np.array(["", None, *[str(i) for i in range(300)]], dtype=object), size=n)
    values = rng.uniform(0, 100, n) * rng.choice([1.0, 1 / 3, 0.1], size=n)
    index = JobRows(pd.DataFrame({"job_id": ids}))
    sums = index.sum(values)
    for job, rows in index.rows.items():
        total = 0.0
        for v in values[sorted(rows)]:
            total += float(v)
        assert _same(sums[index.code[job]], total), (job, values[rows])
    assert max(len(r) for r in index.rows.values()) >= 8  # jobs long enough for NumPy's pairwise sum to differ
