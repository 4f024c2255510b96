"""Sample times put on one step (``aggregate.sample_steps``): a trace's GPUs sampled at different instants (each host's
exporter on its own clock, a scrape's jitter) read as if sampled together; aligned times are taken as they are."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_cost.perceive.aggregate import last_label, sample_steps, to_dense


def _grid(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """Return ``(ts, row)`` of a random fleet on a random step (whole multiples of it since the epoch), some samples
    missing; and the step."""
    step = float(rng.choice([5, 15, 30, 45, 60, 300]))
    gpus, steps = int(rng.integers(1, 90)), int(rng.integers(3, 60))
    first = np.floor(1_795_000_000 / step) * step
    row, k = np.meshgrid(np.arange(gpus), np.arange(steps), indexing="ij")
    there = rng.random(row.shape) >= rng.uniform(0, 0.3)
    there[:, :2] = True  # each GPU has two samples in a row: its step is seen
    return first + k[there] * step, row[there], step


@pytest.mark.parametrize("seed", range(40))
def test_aligned_times_are_taken_as_they_are(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ts, row, _ = _grid(rng)
    order = rng.permutation(len(ts))  # in any order of rows
    times, col, keep, step = sample_steps(ts[order], row[order])
    assert step is None and keep is None
    np.testing.assert_array_equal(times, np.unique(ts))
    np.testing.assert_array_equal(times[col], ts[order])


@pytest.mark.parametrize("seed", range(40))
def test_times_off_the_step_are_read_at_it(seed: int) -> None:
    """A host's clock (up to 40 % of a step off) and a scrape's jitter (up to 5 %) put each sample back on its
    step; the step is an exporter's usual one (or, 45 s here, the nearest whole second)."""
    rng = np.random.default_rng(seed)
    ts, row, true = _grid(rng)
    hosts = row // 8
    offset = rng.uniform(-0.4, 0.4, hosts.max() + 1) * true
    shifted = ts + offset[hosts] + rng.uniform(-0.05, 0.05, len(ts)) * true
    order = rng.permutation(len(ts))
    times, col, keep, step = sample_steps(shifted[order], row[order])
    if len(np.unique(hosts)) == 1 and np.median(np.diff(np.unique(shifted))) >= true / 2:
        pytest.skip("one host, jitter too small to misalign: taken as it is")  # pragma: no cover
    assert step == true and keep is None
    np.testing.assert_array_equal(times[col], ts[order])  # each sample on its own step again


@pytest.mark.parametrize("seed", range(20))
def test_of_one_gpus_samples_on_one_step_the_latest_is_kept(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ts, row, true = _grid(rng)
    jitter = ts + rng.uniform(0, 0.05, len(ts)) * true + (row % 3) * 0.1 * true  # three clocks
    extra = rng.choice(len(ts), size=max(1, len(ts) // 20), replace=False)
    again = jitter[extra] + rng.uniform(0.01, 0.05, len(extra)) * true  # a second sample within the same step
    all_ts, all_row = np.concatenate([jitter, again]), np.concatenate([row, row[extra]])
    order = rng.permutation(len(all_ts))
    all_ts, all_row = all_ts[order], all_row[order]
    _, col, keep, step = sample_steps(all_ts, all_row)
    assert step == true and keep is not None and int((~keep).sum()) == len(extra)
    frame = pd.DataFrame({"row": all_row, "col": col, "ts": all_ts})
    latest = frame.groupby(["row", "col"])["ts"].transform("max").to_numpy()
    np.testing.assert_array_equal(keep, all_ts == latest)


def test_the_live_trace_reads_hosts_on_their_own_clocks_on_one_step() -> None:
    """The trace source's matrix: two hosts a quarter of a step apart read as one column a step, every GPU full."""
    t = 1_795_000_020.0 + 60.0 * np.arange(30)
    samples = pd.concat([pd.DataFrame({"ts": t + off, "host": h, "gpu": 0, "util": 50.0, "mem_used_mib": 1.0,
                                       "job_id": "7"}) for h, off in (("a", 0.0), ("b", 15.0))])
    _, times, arrays = to_dense(samples, t[0] - 1, t[-1] + 60)
    assert len(times) == 30 and np.diff(times).tolist() == [60.0] * 29
    assert not np.isnan(arrays["util"]).any() and (arrays["job"] == "7").all()


def test_a_gpu_without_a_sample_at_the_end_keeps_the_job_it_was_last_seen_with() -> None:
    job = np.array([["1", "1", "1"], ["2", "2", ""], ["", "", ""], ["3", "", ""]], dtype=object)
    util = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, np.nan], [np.nan] * 3, [1.0, 0.0, 0.0]])
    mem = np.where(np.isnan(util), np.nan, 1.0)
    mem[3, 2] = np.nan  # util alone is a sample
    # row 1 missed the last scrape: its job stays; row 3's last sample says no job; row 2 has none
    assert last_label(job, util, mem).tolist() == ["1", "2", "", ""]
    assert last_label(job[:, -1:], util, mem).tolist() == ["1", "", "", ""]  # only the last column's labels given
