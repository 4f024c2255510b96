"""A jobs file's time limits in minutes (``sacct``'s ``TimelimitRaw``) are refused, not read as seconds.

Read as seconds, limits in minutes are 60 times too short: every long job "runs past" its limit, the stakes of
a decision and the savings until the limit are 0, and the forecast backtest's baseline is nonsense. A scheduler
ends a job at its limit, so on a real trace hardly an ended job runs past half again its limit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.core.errors import TraceError
from gpu_cost.perceive.trace import normalise_jobs

LIMITS = np.array([1800, 3600, 7200, 6 * 3600, 12 * 3600, 24 * 3600], dtype=float)


def _jobs(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """``n`` jobs as a scheduler ends them: each within its limit, a quarter killed at it (a few seconds past, as
    the kill takes), some still running."""
    limit = rng.choice(LIMITS, n)
    ran = limit * rng.uniform(0.02, 1.0, n)
    at_limit = rng.random(n) < 0.25
    ran[at_limit] = limit[at_limit] + rng.uniform(0, 60, int(at_limit.sum()))
    start = 1.79e9 + rng.uniform(0, 86400 * 30, n)
    end = start + ran
    end[rng.random(n) < 0.1] = np.nan  # running
    return pd.DataFrame({"job_id": [str(100 + i) for i in range(n)], "user": "ann", "start_ts": start,
                         "end_ts": end, "time_limit_s": limit})


@pytest.mark.parametrize("seed", range(20))
def test_limits_in_seconds_read_and_in_minutes_refused(seed: int) -> None:
    rng = np.random.default_rng(seed)
    jobs = _jobs(rng, int(rng.integers(10, 300)))
    got = normalise_jobs(jobs.copy(), "jobs.csv")
    assert got["time_limit_s"].tolist() == jobs["time_limit_s"].tolist()
    minutes = jobs.assign(time_limit_s=jobs["time_limit_s"] / 60)
    ran = minutes["end_ts"] - minutes["start_ts"]
    if int(((ran >= 600) & minutes["end_ts"].notna()).sum()) >= 20:
        with pytest.raises(TraceError, match=r"jobs\.csv: column time_limit_s looks like minutes") as e:
            normalise_jobs(minutes, "jobs.csv")
        assert "Write the limits in seconds" in str(e.value) and "row " in str(e.value)
    else:  # too few long jobs to tell a unit by: read as written
        normalise_jobs(minutes, "jobs.csv")


def test_a_few_jobs_past_their_limit_are_read_as_they_are() -> None:
    """A cluster that lets some jobs run over (Slurm's OverTimeLimit, a partition without enforcement): a third of
    the long jobs past half again their limit is no unit error."""
    rng = np.random.default_rng(1)
    jobs = _jobs(rng, 200)
    over = jobs.index[:60]
    jobs.loc[over, "end_ts"] = jobs.loc[over, "start_ts"] + 2 * jobs.loc[over, "time_limit_s"]
    normalise_jobs(jobs, "jobs.csv")


def test_the_thetagpu_log_reads_and_its_limits_in_minutes_do_not(shared_data: Path) -> None:
    jobs = pd.read_csv(shared_data / "thetagpu_jobs.csv")
    normalise_jobs(jobs.copy(), "thetagpu_jobs.csv")
    with pytest.raises(TraceError, match="looks like minutes"):
        normalise_jobs(jobs.assign(time_limit_s=jobs["time_limit_s"] / 60), "thetagpu_jobs.csv")


def test_the_forecast_reads_limits_as_the_replay_does(tmp_path: Path) -> None:
    """``gpu-cost forecast backtest`` reads its jobs with its own reader: limits in minutes are refused there too
    (its baseline is the limit itself)."""
    from gpu_cost.capacity.forecast.history import load_jobs

    jobs = _jobs(np.random.default_rng(2), 200)
    jobs.to_csv(seconds := tmp_path / "seconds.csv", index=False)
    assert load_jobs(seconds)["time_limit_s"].tolist() == jobs["time_limit_s"].tolist()
    jobs.assign(time_limit_s=jobs["time_limit_s"] / 60).to_csv(minutes := tmp_path / "minutes.csv", index=False)
    with pytest.raises(TraceError, match=r"minutes\.csv: column time_limit_s looks like minutes"):
        load_jobs(minutes)
