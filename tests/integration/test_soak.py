"""Soak (short form in the suite; the full 24 h with `make bench`): steady memory, bounded growth, no duplicates."""

from __future__ import annotations

import pytest
from bench.soak import soak

pytestmark = pytest.mark.integration


def test_six_hours_of_sweeps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = soak(hours=6, interval=300, db=str(tmp_path / "soak.db"))
    assert r["runs"] == 72
    assert r["duplicate_decisions"] == 0 and r["duplicate_actions"] == 0
    # every sweep writes one run row and a handful of usage rows; decisions only when a rung is due
    assert r["rows_per_run_max"] <= 40
    assert r["rss_growth_second_half_mb"] < 25
    assert r["decisions"] < r["runs"], "the ladder must wait between rungs, not decide every run"
