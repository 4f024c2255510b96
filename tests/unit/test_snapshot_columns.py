"""A snapshot's GPU columns (``Snapshot.columns``): what a rule reads as ``view(window)[name].to_numpy(dtype)``, read
once per frame and window, never changed by a reader."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.fixtures.core import NOW

DTYPES = (None, float, bool, object)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    return all(x == y or (x != x and y != y) for x, y in zip(a.tolist(), b.tolist(), strict=True))


@pytest.mark.parametrize("seed", range(4))
def test_every_column_of_every_window_is_the_views(policy, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Over simulated clusters of several seeds: each column, in each window the rules read, as each dtype a reader
    asks, equals the view's column; a window's own column (its ``stale``, its maxima) wins over the primary one."""
    from gpu_cost.sim.cluster import generate_scenario, snapshot

    snap = snapshot(policy, NOW, generate_scenario(nodes=4 + seed, gpus_per_node=8, seed=seed))
    assert snap.windows, "the default policy's rules read windows besides the primary one"
    for w in [None, *snap.windows]:
        view = snap.view(snap.window_s if w is None else w)
        cols = snap.columns(w)
        assert len(cols) == len(view) and cols.empty == view.empty
        for name in view.columns:
            assert name in cols
            for dtype in DTYPES:
                try:
                    expected = view[name].to_numpy(dtype=dtype)
                except (TypeError, ValueError):
                    continue  # a text column is no number
                got = cols.get(name, dtype)
                assert _same(got, expected), (w, name, dtype)
        assert "no such column" not in cols
    longer = max(snap.windows)
    # the longer window's own maxima, not the primary window's
    assert _same(snap.columns(longer).get("util_max", float), snap.windows[longer]["util_max"].to_numpy(dtype=float))


def test_columns_are_read_once_and_never_changed(policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.sim.cluster import snapshot

    snap = snapshot(policy, NOW)
    cols = snap.columns()
    stale = cols.get("stale", bool)
    assert cols.get("stale", bool) is stale and snap.columns() is cols  # once per frame: shared by every reader
    for name, dtype in (("stale", bool), ("gpu", float), ("host", object)):  # a view of the frame's, or a copy
        with pytest.raises(ValueError):
            cols.get(name, dtype)[0] = cols.get(name, dtype)[1]  # read-only: a reader's change would be every later one's
    # a snapshot built with another frame reads that frame's columns
    other = dataclasses.replace(snap, gpus=snap.gpus.assign(stale=True))
    assert other.columns().get("stale", bool).all() and not snap.columns().get("stale", bool).all()
    # the cluster's own GPUs: all but those attributed outside the scheduler, read once, read-only
    outside = dataclasses.replace(snap, gpus=snap.gpus.assign(attribution=["outside"] + ["slurm"] * (len(snap.gpus) - 1)))
    assert outside.columns().ours().tolist() == [False] + [True] * (len(snap.gpus) - 1)
    assert outside.outside_count() == 1 and snap.columns().ours().all() and snap.outside_count() == 0
    assert outside.columns().ours() is outside.columns().ours() and not outside.columns().ours().flags.writeable
    with pytest.raises(KeyError, match="no aggregates for a 123s window"):
        snap.columns(123.0)
    with pytest.raises(KeyError):
        cols.get("no such column")
