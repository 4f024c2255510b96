"""The Prometheus source against a real Prometheus scraping simulated dcgm-exporters."""

from __future__ import annotations

import dataclasses
import math
import socket
import time

import numpy as np
import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import WINDOW_COLUMNS
from gpu_cost.perceive.prometheus import PromConfig, PrometheusSource
from tests.fixtures.prometheus import PromLab

pytestmark = pytest.mark.integration

EXACT = ["util_mean", "util_max", "power_w", "util_mean_lb", "util_max_lb", "busy_share_lb"]
COUNTS = ["n_samples", "expected_samples", "bursts_lb", "n_lb", "stale"]


class SimScheduler:
    """The scheduler view of a simulated scenario (the simulator's jobs for the simulator's GPUs)."""

    def __init__(self, path, now: float) -> None:  # type: ignore[no-untyped-def]
        from gpu_cost.sim.cluster import SimCluster, load_scenario

        self.cluster = SimCluster(load_scenario(path), anchor=now)
        self.now = now

    def jobs(self):  # type: ignore[no-untyped-def]
        return self.cluster.jobs_at(self.now)

    def nodes(self):  # type: ignore[no-untyped-def]
        return self.cluster.nodes_at(self.now)

    def reservations(self):  # type: ignore[no-untyped-def]
        return []  # the simulated cluster holds no Slurm reservation


def _compare(prom, sim, exact: bool) -> None:  # type: ignore[no-untyped-def]
    p = prom.set_index(["host", "gpu"]).sort_index()
    s = sim.set_index(["host", "gpu"]).sort_index()
    assert list(p.index) == list(s.index)
    assert (p["uuid"] == s["uuid"]).all() and (p["model"] == s["model"]).all()
    assert (p["label_job_id"] == s["label_job_id"]).all()
    tol = 0.01 if exact else 2.0
    # live util_max and power_w: see _within (a window edge sample more or less moves them most)
    for col in EXACT if exact else [c for c in EXACT if c not in ("util_max", "power_w")]:
        if col == "busy_share_lb" and exact:
            # a sample at the busy threshold itself reads either side of it once the exporter has rounded it
            # (its ratio to 6 decimals): which anchor puts one there is the wall clock's, so one sample may differ
            one = 1.0 / s["n_lb"].to_numpy(float) + 1e-9
            diff = np.abs(p[col].to_numpy(float) - s[col].to_numpy(float))
            assert (diff <= one).all(), (col, p[col].to_numpy(float), s[col].to_numpy(float))
            continue
        np.testing.assert_allclose(p[col].to_numpy(float), s[col].to_numpy(float), rtol=1e-7,
                                   atol=tol if col != "busy_share_lb" else tol / 50, err_msg=col)
    for col in ("mem_min_mib", "mem_max_mib", "mem_total_mib"):  # the exporter prints whole MiB
        np.testing.assert_allclose(p[col].to_numpy(float), s[col].to_numpy(float), atol=1.0 if exact else 100.0, err_msg=col)
    for col in COUNTS:
        assert (p[col].to_numpy() == s[col].to_numpy()).all(), col
    # the framebuffer trend (deriv, stdvar_over_time, timestamp()): whole MiB move a slope by a fraction of
    # a MiB/h and a near-zero R² by a little; a constant memory is constant in both (R² NaN in both)
    np.testing.assert_allclose(p["mem_slope_mib_h_lb"].to_numpy(float), s["mem_slope_mib_h_lb"].to_numpy(float),
                               rtol=1e-4 if exact else 0.02, atol=0.1 if exact else 20.0, err_msg="mem_slope_mib_h_lb")
    # (tight enough to catch var(t) taken as span²/12 instead of the samples' own variance: R² 0.411 → 0.409)
    np.testing.assert_allclose(p["mem_r2_lb"].to_numpy(float), s["mem_r2_lb"].to_numpy(float),
                               rtol=1e-3 if exact else 0.05, atol=1e-3 if exact else 0.05, err_msg="mem_r2_lb")
    np.testing.assert_allclose(p["mem_span_s_lb"].to_numpy(float), s["mem_span_s_lb"].to_numpy(float),
                               atol=0.0 if exact else 120.0, err_msg="mem_span_s_lb")


def _live_bounds(scenario, policy, now: float, anchor: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # type: ignore[no-untyped-def]
    """What live scrapes can give for ``util_max`` and ``power_w``, per (host, gpu) in sorted order.

    A scrape at ``τ`` shows the sample of the interval in progress (the grid point at or after ``τ``,
    as the exporter reads its clock a little after Prometheus stamps the scrape), and a subquery step
    at ``t`` reads the latest sample at or before ``t``. So a step's value is the simulator's at ``t``,
    at ``t + step`` (a scrape stamped just before the grid point but served just after), at
    ``t - step`` (scrapes missed for a step on a loaded machine), or, before the first live scrape
    of the session, the last backfilled sample (the anchor's). The window's mean power and maximum
    utilisation lie between those of the per-step lowest and highest of these.
    """
    from gpu_cost.perceive.snapshot import rule_windows
    from gpu_cost.sim.cluster import SimCluster

    step = float(policy.sweep.sample_interval)
    window, _ = rule_windows(policy)
    m = SimCluster(scenario, anchor=anchor).matrix(now - window - 2 * step, now + step)
    times = m.times
    at = np.flatnonzero((times > now - window) & (times <= now))
    assert len(at) and at[0] >= 1 and at[-1] + 1 < len(times)
    first = int(np.searchsorted(times, anchor))  # the backfill's last sample (times are on the grid)
    out = {}
    # as the exporter prints them: GR_ENGINE_ACTIVE (a ratio to 6 places, read ×100) and power to 3 places
    util = np.round(np.clip(m.util, 0, 100) / 100.0, 6) * 100.0
    for col, values in (("util_max", util), ("power_w", np.round(m.power, 3))):
        lows, highs = [], []
        for i in at:
            cands = [values[:, i - 1], values[:, i], values[:, i + 1]]
            if times[i] > anchor and 0 <= first < len(times):
                cands.append(values[:, first])
            c = np.stack(cands)
            lows.append(np.nanmin(c, axis=0))
            highs.append(np.nanmax(c, axis=0))
        lo, hi = np.stack(lows, axis=1), np.stack(highs, axis=1)
        if col == "util_max":
            lo, hi = np.nanmax(lo, axis=1), np.nanmax(hi, axis=1)
        else:
            lo, hi = np.nanmean(lo, axis=1), np.nanmean(hi, axis=1)
        order = np.lexsort((m.gpus, m.hosts))
        out[col] = (lo[order], hi[order])
    return out


def _within(prom, bounds: tuple[np.ndarray, np.ndarray], col: str, atol: float) -> None:  # type: ignore[no-untyped-def]
    rows = prom.sort_values(["host", "gpu"])
    assert not rows.duplicated(["host", "gpu"]).any()  # one row a GPU: the order matches the matrix's
    p = rows[col].to_numpy(float)
    lo, hi = bounds
    bad = np.flatnonzero(~((p >= lo - atol) & (p <= hi + atol)))  # NaN anywhere fails
    rows = rows[["host", "gpu"]].to_numpy()
    assert not len(bad), [(col, *rows[i], p[i], lo[i], hi[i]) for i in bad]


def test_snapshot_columns_equal_the_simulators_aggregation(prom_lab: PromLab, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.sim.cluster import load_scenario
    from gpu_cost.sim.cluster import snapshot as sim_snapshot

    scenario = load_scenario(prom_lab.scenarios["gpu-sim"])
    src = PrometheusSource(prom_lab.config('job="gpu-sim"'))
    # at the anchor every sample is backfilled history: exactly the simulator's grid
    at = prom_lab.anchor
    frame, windows = src.gpu_frame(policy, at)
    sim = sim_snapshot(policy, at, scenario)
    _compare(frame, sim.gpus, exact=True)
    assert set(windows) == set(sim.windows)
    for w, extra in windows.items():
        # the same columns as the simulator's windows (no power of their own: every rule reads the primary window's)
        assert list(extra.columns) == list(sim.windows[w].columns) == list(WINDOW_COLUMNS)
        np.testing.assert_allclose(extra["util_mean"].to_numpy(float), sim.windows[w]["util_mean"].to_numpy(float), atol=0.01)
        assert (extra["n_samples"].to_numpy() == sim.windows[w]["n_samples"].to_numpy()).all()
    assert src.queries_made == 5  # rules (none here), then current, windows, lookback and chart at once
    # the simulator's GPUs are varied enough for the comparison to mean something
    assert frame["util_max"].max() > 80 and frame["util_max"].min() < 5 and frame["bursts_lb"].max() >= 2
    # … and their memory too: jobs starting within the lookback (steps), a leak (1006), empty GPUs (constant)
    slope, r2 = frame["mem_slope_mib_h_lb"], frame["mem_r2_lb"]
    assert slope.max() > 1024 and (slope.abs() < 5).any() and r2.max() > 0.3 and r2.min() < 0.01 and r2.isna().any()

    # later, on live scrapes: the same picture within tolerance, nothing stale
    while time.time() < prom_lab.first_scrape + 2 * 5 + 1:
        time.sleep(0.5)
    now = math.floor(time.time() / 60) * 60
    if now > prom_lab.anchor and now < prom_lab.first_scrape:
        now = prom_lab.anchor
    frame, _ = src.gpu_frame(policy, now)
    sim = sim_snapshot(policy, now, scenario)
    _compare(frame, sim.gpus, exact=False)
    bounds = _live_bounds(scenario, policy, now, prom_lab.anchor)
    assert (bounds["power_w"][0] < bounds["power_w"][1]).any()  # some GPUs' power does vary between steps
    _within(frame, bounds["util_max"], "util_max", atol=1e-6)
    _within(frame, bounds["power_w"], "power_w", atol=0.01)
    assert not frame["stale"].any()


def test_number_of_queries_is_constant_for_2_and_20_nodes(prom_lab: PromLab, policy) -> None:  # type: ignore[no-untyped-def]
    counts = {}
    # node_exporter's CPU figure is a rate: it needs two of its scrapes, which a test run early in the session
    # may not have yet (wait for them with another source: the counted ones below make only their own queries)
    deadline = time.time() + 30
    while time.time() < deadline and "cpu_util" not in PrometheusSource(prom_lab.config('job="gpu-small"')).node_stats(
            policy, time.time()).get("gpu01", {}):
        time.sleep(1)
    for job, nodes in (("gpu-small", 2), ("gpu-big", 20)):
        src = PrometheusSource(prom_lab.config(f'job="{job}"'))
        # these exporters started with the session (no backfill): asked about the session's first
        # minute, whenever the test runs, a 15-minute window holds a few samples only
        now = min(time.time(), prom_lab.first_scrape + 60)
        frame, _ = src.gpu_frame(policy, now)
        stats = src.node_stats(policy, now)
        assert len(frame) == nodes * 8 and frame["host"].nunique() == nodes
        assert frame["stale"].all(), "too few samples must be stale, not idle"
        assert {"gpu01", "gpu02", "gpu03"} <= set(stats) and 0 <= stats["gpu01"]["cpu_util"] <= 100
        assert stats["gpu01"]["mem_total_bytes"] > stats["gpu01"]["mem_available_bytes"] > 0
        counts[nodes] = src.queries_made
    assert counts[2] == counts[20] == 6


def test_stopped_exporter_is_stale_not_idle(prom_lab: PromLab, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.perceive import live

    src = PrometheusSource(prom_lab.config('job="gpu-stop"'))
    now = time.time()
    before = live.snapshot(policy, now, prometheus=src, slurm=SimScheduler(prom_lab.scenarios["gpu-stop"], now), processes=False)
    assert not before.gpus["stale"].any(), before.gpus
    assert [f.target for f in run_rules(before, policy) if f.rule == "zombie"] == ["gpu:gpu09:0"]

    prom_lab.stop_process("gpu-stop")
    prom_lab.wait_down("gpu-stop")
    now = time.time()
    after = live.snapshot(policy, now, prometheus=PrometheusSource(prom_lab.config('job="gpu-stop"')),
                          slurm=SimScheduler(prom_lab.scenarios["gpu-stop"], now), processes=False)
    assert len(after.gpus) == 2 and after.gpus["stale"].all()
    assert after.gpus["last_ts"].isna().all()
    assert "every GPU series is stale or missing" in after.problems
    assert run_rules(after, policy) == []


def test_check_fresh(prom_lab: PromLab, policy, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.loop import sweep

    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", prom_lab.conn_env('job="gpu-sim"'))
    ok, why = sweep.check_fresh(policy, time.time(), "prometheus")
    assert ok, why
    ok, why = sweep.check_fresh(policy, time.time() + 3600, "prometheus")
    assert not ok and "no GPU sample" in why


def test_prometheus_down_or_silent(policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.perceive import live

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    down = PrometheusSource(PromConfig(url=f"http://127.0.0.1:{closed}", timeout=2))
    with pytest.raises(SourceError, match="cannot be reached"):
        down.gpu_frame(policy, time.time())
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        mute = PrometheusSource(PromConfig(url=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1))
        with pytest.raises(SourceError, match="did not answer"):
            mute.gpu_frame(policy, time.time())
        ok, why = live.check_fresh(policy, time.time(), prometheus=mute)
        assert not ok and "did not answer" in why
    snap = live.snapshot(policy, time.time(), prometheus=down, slurm=SimScheduler(None, time.time()), processes=False)
    assert snap.degraded and any(p.startswith("prometheus:") for p in snap.problems)
    assert snap.gpus.empty and snap.jobs  # the rest of the picture is still there


def test_bad_query_is_a_source_error(prom_lab: PromLab, policy) -> None:  # type: ignore[no-untyped-def]
    src = PrometheusSource(dataclasses.replace(prom_lab.config(), selector='job=~"('))
    with pytest.raises(SourceError, match="refused the current query"):
        src.gpu_frame(policy, time.time())
