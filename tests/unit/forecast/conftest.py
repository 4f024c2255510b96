"""Synthetic job histories for the forecast tests (deterministic, no files)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

T0 = 1_700_000_000.0


def synthetic_jobs(n: int = 1500, seed: int = 0) -> pd.DataFrame:
    """Jobs of a few users whose runtimes persist from one job to the next (as real users' do).

    Each user has a habit (a runtime ratio that drifts slowly) and sometimes runs into the limit.
    """
    rng = np.random.default_rng(seed)
    users = [f"u{i}" for i in range(8)]
    habit = {u: rng.uniform(0.05, 0.8) for u in users}
    rows = []
    t = T0
    for i in range(n):
        u = users[int(rng.integers(len(users)))]
        habit[u] = float(np.clip(habit[u] + rng.normal(0, 0.02), 0.02, 0.95))
        limit = float(rng.choice([3600.0, 4 * 3600.0, 12 * 3600.0]))
        ratio = 1.0 if rng.random() < 0.1 else float(np.clip(habit[u] * rng.lognormal(0, 0.15), 0.01, 1.0))
        t += float(rng.exponential(900))
        start = t + float(rng.uniform(0, 120))
        rows.append({"job_id": str(1000 + i), "user": u, "account": f"a{users.index(u) % 3}", "partition": "gpu",
                     "name": f"train-{i}", "state": "COMPLETED", "submit_ts": t, "start_ts": start,
                     "end_ts": start + ratio * limit, "time_limit_s": limit, "gpus": int(rng.choice([1, 8]))})
    return pd.DataFrame(rows)


@pytest.fixture
def jobs() -> pd.DataFrame:
    return synthetic_jobs()
