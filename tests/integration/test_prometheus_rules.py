"""The shipped recording rules on a real Prometheus: the source reads their series and answers as on raw ones.

A Prometheus of its own (not the session's ``prom_lab``, whose other tests want raw series only)
holds the default scenario's 6.5 h of 1-minute history and the shipped rules' output for it,
written by ``promtool tsdb create-blocks-from rules`` against that server.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from gpu_cost.perceive import recording
from gpu_cost.perceive.prometheus import PromConfig, PrometheusSource
from tests.fixtures.core import ROOT, need
from tests.fixtures.prometheus import TsdbProm, _check, gpu_cost_bin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLOAT_COLUMNS = ["util_mean", "util_max", "mem_min_mib", "mem_max_mib", "mem_total_mib", "power_w", "last_ts",
                 "util_mean_lb", "util_max_lb", "busy_share_lb", "mem_slope_mib_h_lb", "mem_r2_lb", "mem_span_s_lb"]
EXACT_COLUMNS = ["host", "gpu", "uuid", "model", "label_job_id", "n_samples", "expected_samples", "bursts_lb", "n_lb",
                 "stale", "util_chart_lb"]


@dataclasses.dataclass
class RulesLab:
    prom: TsdbProm
    anchor: float
    scenario: Path


def _lab(session_tmp: Path, scenario_name: str) -> Iterator[RulesLab]:
    need("prometheus", "promtool")
    root = session_tmp / f"prometheus-rules-{scenario_name}"
    root.mkdir(parents=True, exist_ok=True)
    anchor = float(math.floor(time.time() / 60) * 60)
    doc = yaml.safe_load((ROOT / "include" / "scenarios" / f"{scenario_name}.yaml").read_text())
    doc["anchor"] = int(anchor)
    scenario = root / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    om = root / "history.om"
    _check([gpu_cost_bin(), "sim", "backfill", "--scenario", str(scenario), "--start", "6h30m", "--end",
            str(int(anchor)), "--label", "job=dcgm", "--label", "instance=127.0.0.1:9400", "--out", str(om), "--json"])
    prom = TsdbProm(root)
    prom.add_openmetrics(om)
    om.unlink()
    try:
        prom.start()
        # a minute past the history's end: the rules' evaluation after the last grid step reads it
        prom.backfill_rules(ROOT / recording.SHIPPED, anchor - 6.5 * 3600, anchor + 60)
        yield RulesLab(prom, anchor, scenario)
    finally:
        prom.stop()


@pytest.fixture(scope="module")
def rules_lab(session_tmp: Path) -> Iterator[RulesLab]:
    yield from _lab(session_tmp, "default")


@pytest.fixture(scope="module")
def modern_rules_lab(session_tmp: Path) -> Iterator[RulesLab]:
    """MIG slices (each its own GR_ENGINE_ACTIVE series), shared GPUs and a multi-node job."""
    yield from _lab(session_tmp, "modern")


def _frames(lab: RulesLab, policy, at: float):  # type: ignore[no-untyped-def]
    # asked just before the next grid step: the raw path reads the grid ending at ``at``, the
    # recorded one the rules' evaluation after it (at its phase within the minute), same samples
    at = at + 59.999
    raw = PrometheusSource(PromConfig(url=lab.prom.url, timeout=60, recording_rules=False))
    rec = PrometheusSource(PromConfig(url=lab.prom.url, timeout=60))
    return raw, raw.gpu_frame(policy, at), rec, rec.gpu_frame(policy, at)


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b) > 0
    for col in EXACT_COLUMNS:
        assert a[col].tolist() == b[col].tolist(), col
    for col in FLOAT_COLUMNS:
        x, y = a[col].to_numpy(float), b[col].to_numpy(float)
        assert (np.isnan(x) == np.isnan(y)).all(), col
        # pooled means and variances equal the one-pass ones to float rounding, not bit for bit
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-6, err_msg=col)


def test_recorded_chunks_answer_as_raw_series(rules_lab: RulesLab, policy) -> None:  # type: ignore[no-untyped-def]
    raw, (frame_raw, win_raw), rec, (frame_rec, win_rec) = _frames(rules_lab, policy, rules_lab.anchor)
    assert raw.rules_used == "" and rec.rules_used == "chunks"
    # raw series: current, windows, lookback and chart at once; with the rules, a small query about them
    # first, then current, windows and a range query per chunk series at once
    assert raw.queries_made == 4 and rec.queries_made == 3 + len(recording.CHUNK_READS)
    _same(frame_raw, frame_rec)
    assert set(win_raw) == set(win_rec) and win_raw
    for w in win_raw:
        _same_window(win_raw[w], win_rec[w])
    # the data exercise what the chunks put together: bursts (and one on the lookback's edge is
    # left out as the raw query does), memory that leaks, steps and stays constant (R² NaN)
    assert frame_rec["bursts_lb"].max() >= 2 and frame_rec["util_max_lb"].max() > 80
    slope, r2 = frame_rec["mem_slope_mib_h_lb"], frame_rec["mem_r2_lb"]
    assert slope.max() > 1024 and r2.max() > 0.3 and r2.isna().any()
    assert (frame_rec["n_lb"] == 360).all()  # a whole lookback on the grid


def _same_window(a, b) -> None:  # type: ignore[no-untyped-def]
    for col in a.columns:
        x, y = a[col].to_numpy(float), b[col].to_numpy(float)
        assert (np.isnan(x) == np.isnan(y)).all(), col
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-6, err_msg=col)


def test_per_sample_series_when_chunks_do_not_tile_the_lookback(rules_lab: RulesLab, policy) -> None:  # type: ignore[no-untyped-def]
    three_h = dataclasses.replace(policy, sweep=dataclasses.replace(policy.sweep, lookback=3 * 3600.0))
    _, (frame_raw, _), rec, (frame_rec, _) = _frames(rules_lab, three_h, rules_lab.anchor)
    assert rec.rules_used == "samples"  # 15-minute chart buckets are not whole 30-minute chunks
    _same(frame_raw, frame_rec)


@pytest.mark.parametrize(
    ("change", "at_offset"),
    [({"busy_util": 30.0}, 0.0), ({"sample_interval": 30.0}, 0.0), ({}, -3600.0)],
    ids=["other-busy-threshold", "other-sample-interval", "rules-younger-than-the-lookback"],
)
def test_raw_queries_when_the_rules_do_not_fit(rules_lab: RulesLab, policy, change, at_offset) -> None:  # type: ignore[no-untyped-def]
    other = dataclasses.replace(policy, sweep=dataclasses.replace(policy.sweep, **change))
    at = rules_lab.anchor + at_offset
    _, (frame_raw, _), rec, (frame_rec, _) = _frames(rules_lab, other, at)
    assert rec.rules_used == ""
    _same(frame_raw, frame_rec)


def test_recorded_series_keep_mig_slices_apart(modern_rules_lab: RulesLab, policy) -> None:  # type: ignore[no-untyped-def]
    _, (frame_raw, win_raw), rec, (frame_rec, win_rec) = _frames(modern_rules_lab, policy, modern_rules_lab.anchor)
    assert rec.rules_used == "chunks"
    _same(frame_raw, frame_rec)
    for col in ("mig", "mig_profile", "share"):
        assert frame_raw[col].tolist() == frame_rec[col].tolist(), col
    slices = frame_rec[frame_rec["mig"].astype(str) != ""]
    # each slice is a device of its own: several rows of one GPU, each with its own utilisation
    assert len(slices) >= 2 and slices.groupby(["host", "gpu"]).size().max() >= 2
    for w in win_raw:
        _same_window(win_raw[w], win_rec[w])
