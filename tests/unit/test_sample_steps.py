"""Sample times put on one step (``aggregate.sample_steps``): a trace's GPUs sampled at different instants (each host's
exporter on its own clock, a scrape's jitter) read as if sampled together; aligned times are taken as they are."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_cost.perceive.aggregate import (
    LOOKBACK_DELTA_S,
    coarse_step,
    held_cells,
    last_label,
    sample_steps,
    to_dense,
)


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


def _fleet(rng: np.random.Generator, step: float, gpus: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(ts, row)``: each of ``gpus`` sampled every ``step`` for ``steps`` steps from a whole step."""
    first = np.floor(1_795_000_000 / step) * step
    row, k = np.meshgrid(np.arange(gpus), np.arange(steps), indexing="ij")
    return first + k.ravel() * step, row.ravel()


def _consecutive(times: np.ndarray, col: np.ndarray, ts: np.ndarray, row: np.ndarray, step: float) -> None:
    """Assert each GPU's samples are read on their own steps, all of them moved by one whole step or none."""
    shift = times[col] - ts
    for r in np.unique(row):
        mine = shift[row == r]
        assert np.ptp(mine) == 0, f"GPU {r}: its samples moved apart ({np.unique(mine)})"
        assert abs(mine[0]) <= step


@pytest.mark.parametrize("seed", range(30))
def test_a_host_at_any_phase_of_the_step_loses_no_sample(seed: int) -> None:
    """Each host scraped at its own phase of the step, anywhere in it: exactly half a step off in whole seconds (as a
    CSV writes them) for some, plus a second or two of jitter. No sample is lost, and each GPU's samples stay on
    consecutive steps. (Before, each sample was rounded alone: a host half a step off lost every other sample, so
    did one a little under half a step off with jitter.)"""
    rng = np.random.default_rng(seed)
    step = float(rng.choice([15, 30, 60]))
    ts, row = _fleet(rng, step, int(rng.integers(8, 40)), int(rng.integers(20, 200)))
    hosts = row // 4
    phase = np.where(rng.random(hosts.max() + 1) < 0.3, step / 2, rng.uniform(0, step, hosts.max() + 1))
    seen = np.round(ts + phase[hosts] + rng.uniform(-0.06, 0.06, len(ts)) * step, 0 if seed % 2 else 3)
    order = rng.permutation(len(ts))
    times, col, keep, got = sample_steps(seen[order], row[order])
    assert got == step and keep is None
    _consecutive(times, col, ts[order], row[order], step)


@pytest.mark.parametrize("seed", range(10))
def test_an_exporter_restarted_at_another_phase_is_followed(seed: int) -> None:
    """A host's exporter restarted on the hour at a new phase of the step (at most half a step away): each hour's
    samples are read at that hour's phase, and none is lost."""
    rng = np.random.default_rng(seed)
    step = 30.0
    first = np.ceil(1_795_000_000 / 3600) * 3600
    ts, row = _fleet(rng, step, 8, 480)  # four hours
    ts = ts - ts.min() + first
    hour = ((ts - first) // 3600).astype(int)
    phase = rng.uniform(0, step, (8, 4))
    phase[:, 1:] = phase[:, :1] + np.cumsum(rng.uniform(-0.45, 0.45, (8, 3)) * step, axis=1)
    seen = ts + phase[row, hour] + rng.uniform(-0.03, 0.03, len(ts)) * step
    _, col, keep, got = sample_steps(seen, row)
    assert got == step and keep is None
    for r in range(8):
        c = np.sort(col[row == r])
        assert np.diff(c).max() <= 2 and np.diff(c).min() >= 1  # a restart moves a GPU by a step at most, never back


@pytest.mark.parametrize("seed", range(10))
def test_a_pool_scraped_faster_than_most_sets_the_step(seed: int) -> None:
    """A few GPUs (a sixteenth of the fleet or less) scraped 2 to 4 times as often as the rest, every host at its
    own phase (or all in line): the step is theirs, and none of their samples is lost (before: the step was the
    many's, and the few lost most of their samples, their bursts with them)."""
    rng = np.random.default_rng(seed)
    fine = 15.0
    k = int(rng.integers(2, 5))
    gpus = int(rng.integers(64, 160))
    few = max(1, gpus // int(rng.integers(16, 40)))
    ts, row = _fleet(rng, fine, gpus, 240)
    slow = row >= few
    there = ~slow | ((ts // fine) % k == 0)
    ts, row = ts[there], row[there]
    phased = seed % 2 == 0
    seen = ts + rng.uniform(0, fine, gpus)[row] + rng.uniform(-0.5, 0.5, len(ts)) if phased else ts
    times, col, keep, got = sample_steps(seen, row)
    assert got == (fine if phased else None) and keep is None  # in line: read as given
    _consecutive(times, col, ts, row, fine)
    assert np.diff(times).max() == fine


@pytest.mark.parametrize("seed", range(10))
def test_a_sample_and_its_double_a_moment_later_do_not_set_a_finer_step(seed: int) -> None:
    """Every sample of some GPUs written twice a second or two apart (two exporters, two replicas): one of each pair
    is kept, and the step stays the fleet's."""
    rng = np.random.default_rng(seed)
    step = float(rng.choice([30, 60]))
    ts, row = _fleet(rng, step, 16, 100)
    ts = ts + (row // 4) * 0.3 * step  # four hosts, four clocks
    twice = row < int(rng.integers(1, 8))
    all_ts = np.concatenate([ts, ts[twice] + rng.uniform(1, 2, int(twice.sum()))])
    all_row = np.concatenate([row, row[twice]])
    _, _, keep, got = sample_steps(all_ts, all_row)
    assert got == step and keep is not None and int((~keep).sum()) == int(twice.sum())


@pytest.mark.parametrize("seed", range(10))
def test_aligned_times_with_whole_steps_missing_get_a_column_each(seed: int) -> None:
    """Aligned times of a fleet scraped every 60 s for a while and every 30 s after (an interval changed), or with
    steps no GPU has (an outage): every step of the span gets a column, each sample is on its own time."""
    rng = np.random.default_rng(seed)
    ts, row = _fleet(rng, 30.0, int(rng.integers(1, 20)), 200)
    cut = ts.min() + 30.0 * int(rng.integers(20, 180))
    keep = (ts >= cut) | ((ts // 30) % 2 == 0)
    ts, row = ts[keep], row[keep]
    times, col, kept, step = sample_steps(ts, row)
    assert step is None and kept is None  # nothing moved
    np.testing.assert_array_equal(times[col], ts)
    assert np.diff(times).tolist() == [30.0] * (len(times) - 1)


def _matrix_of(ts: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    times, col, keep, _ = sample_steps(ts, row)
    assert keep is None
    return times, row.astype(np.int64) * len(times) + col, col


@pytest.mark.parametrize("seed", range(20))
def test_a_gpu_sampled_every_k_steps_is_held_and_one_losing_samples_is_not(seed: int) -> None:
    """Some GPUs sampled every 2, 3 or 12 steps (a pool scraped more slowly), others every step with random samples
    lost: the slow ones, and only they, have each sample held until their next, for at most 5 minutes; a lossy
    GPU keeps its holes."""
    rng = np.random.default_rng(seed)
    step = 30.0
    gpus = int(rng.integers(4, 30))
    ts, row = _fleet(rng, step, gpus, 240)
    every = rng.choice([1, 1, 2, 3, 12], size=gpus)
    loss = np.where(every == 1, rng.uniform(0, 0.4, gpus), 0.0)
    every[0], loss[0] = 1, 0.0  # one GPU on every step: the trace's step is seen
    there = (((ts // step) % every[row]) == 0) & (rng.random(len(ts)) >= loss[row])
    ts, row = ts[there], row[there]
    times, flat, col = _matrix_of(ts, row)
    cells, src, slow = held_cells(flat, gpus, times)
    assert slow == {r: int(every[r]) for r in range(gpus) if every[r] > 1}
    assert not set(cells.tolist()) & set(flat.tolist())  # a held cell had no sample of its own
    held_row, held_col = cells // len(times), cells % len(times)
    np.testing.assert_array_equal(held_row, row[src])
    assert ((held_col - col[src]) * step <= LOOKBACK_DELTA_S).all() and (held_col > col[src]).all()
    for r in range(gpus):
        mine = np.zeros(len(times), dtype=bool)
        mine[col[row == r]] = True
        mine[held_col[held_row == r]] = True
        full = bool(mine[int(col[row == r].min()):].all())
        if every[r] == 1:
            assert not (held_row == r).any()  # a lossy GPU keeps its holes
        else:  # read full where its step is within the lookback delta, with holes where it is not
            assert full == ((every[r] - 1) * step <= LOOKBACK_DELTA_S)


def test_the_trace_source_reads_a_slower_host_as_a_range_query_does() -> None:
    """The trace source's matrix: a host scraped every 60 s beside one every 30 s reads full, its values held."""
    t = 1_795_000_020.0 + 30.0 * np.arange(60)
    samples = pd.concat([pd.DataFrame({"ts": t, "host": "a", "gpu": 0, "util": 50.0, "mem_used_mib": 1.0, "job_id": "7"}),
                         pd.DataFrame({"ts": t[::2], "host": "b", "gpu": 0, "util": np.arange(30.0), "mem_used_mib": 2.0,
                                       "job_id": "8"})])
    _, times, arrays = to_dense(samples, t[0] - 1, t[-1] + 1)
    assert len(times) == 60 and not np.isnan(arrays["util"]).any() and (arrays["job"][1] == "8").all()
    np.testing.assert_array_equal(arrays["util"][1], np.repeat(np.arange(30.0), 2))


def test_the_step_to_read_a_trace_too_big_to_hold_at() -> None:
    times = 1_795_000_000.0 + np.arange(0, 7 * 86400, 1.0)  # a week at 1 s
    assert coarse_step(times, 10) is None  # 6 M cells: held as they are
    assert coarse_step(times, 100) == 5.0  # 60 M: the least usual step under 25 M
    assert coarse_step(times, 1000) == 30.0
    assert coarse_step(times, 10_000) == 300.0
    assert coarse_step(times[:10], 1) is None
