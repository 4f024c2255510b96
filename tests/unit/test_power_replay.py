"""``gpu-cost power replay``: Slurm's reactive power saving, the off-hours run and the forecast, side by side."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.capacity.forecast import history
from gpu_cost.config.loader import load_policy
from gpu_cost.core.errors import GpuCostError, TraceError
from gpu_cost.core.timeutil import epoch
from gpu_cost.sim.power_replay import STRATEGIES, SUSPEND_TIMES, ReplaySettings, at_waiting, replay, table

START = epoch("2026-11-02T00:00:00Z")  # a Monday


def working_day_series(days: int = 21, day_gpus: float = 64.0, night_gpus: float = 4.0, key: str = "team") -> pd.DataFrame:
    """A team busy 09:00-18:00 UTC every day, nearly idle otherwise."""
    ts = START + 3600.0 * np.arange(days * 24)
    hour = (ts // 3600).astype(int) % 24
    value = np.where((hour >= 9) & (hour < 18), day_gpus, night_gpus)
    return pd.DataFrame({"ts": ts, "key": key, "value": value})


@pytest.fixture(scope="module")
def daily() -> dict:  # type: ignore[type-arg]
    return replay(working_day_series(), load_policy(None))


def test_reactive_saving_makes_every_morning_wait_for_boots(daily: dict) -> None:  # type: ignore[type-arg]
    r = daily["strategies"]["slurm_reactive"]
    # 8 nodes; 15 h a day at 4 GPUs: 7 nodes go down after SuspendTime (30 min) and come back at 09:00
    assert daily["keys"]["team"]["nodes"] == 8
    assert 7 * 14 * 21 <= r["node_hours_off"] <= 7 * 15 * 21
    # each morning 56 GPUs (7 nodes) find their nodes down and wait the 10-minute boot: 9.3 GPU-hours a day
    assert r["gpu_hours_waited"] == pytest.approx(21 * 56 * 600 / 3600, rel=0.01)
    assert r["max_wait_s"] == 600 and r["boots"] == 7 * 21
    # energy is the idle draw of the node-hours off less what the boots cost (offhours.boot_kwh each)
    assert r["kwh_idle_avoided"] == pytest.approx(r["node_hours_off"] * 0.4, abs=0.1)
    assert r["kwh_boots"] == pytest.approx(r["boots"] * 0.15, abs=0.1)
    assert r["kwh_saved"] == pytest.approx(r["kwh_idle_avoided"] - r["kwh_boots"], abs=0.1)
    assert r["usd_saved"] == pytest.approx(r["kwh_saved"] * 0.15, abs=0.01)


def test_the_forecast_prewarms_before_the_mornings_it_has_learnt(daily: dict) -> None:  # type: ignore[type-arg]
    r, f, o = (daily["strategies"][k] for k in ("slurm_reactive", "forecast", "offhours"))
    # refitted daily at 02:00 once 48 h of history exist (day 3): 19 forecasts
    assert daily["keys"]["team"]["forecast_refits"] == 19
    assert f["gpu_hours_waited"] <= 0.3 * r["gpu_hours_waited"]
    # and its band is narrow where the days repeat: nights go down, beyond the windows' share
    assert f["node_hours_off"] > o["node_hours_off"] and f["node_hours_off"] > 0.4 * r["node_hours_off"]
    assert daily["comparison"]["forecast_vs_reactive_waited"] == pytest.approx(
        f["gpu_hours_waited"] / r["gpu_hours_waited"], abs=0.001)


def test_the_off_hours_run_acts_only_in_its_windows_and_caps_each_run(daily: dict) -> None:  # type: ignore[type-arg]
    o = daily["strategies"]["offhours"]
    # weekday nights 22:00-08:00 and the weekend; at most 4 nodes an hour, one kept as the warm reserve
    assert 0 < o["node_hours_off"] < daily["strategies"]["slurm_reactive"]["node_hours_off"]
    assert o["power_downs"] > 0
    held = daily["keys"]["team"]["offhours"]["held"]
    assert held.get("outside the off-hours window", 0) > 0


def test_demand_above_the_pool_queues_under_every_strategy_and_is_not_a_boot_wait() -> None:
    flat = pd.DataFrame({"ts": START + 3600.0 * np.arange(72), "key": "big", "value": 24.0})
    out = replay(flat, load_policy(None), ReplaySettings(nodes=2))
    assert out["gpu_hours_over_pool"] == pytest.approx(8 * 72)
    for name in STRATEGIES:
        assert out["strategies"][name]["gpu_hours_waited"] == 0 and out["strategies"][name]["node_hours_off"] == 0


def test_bad_input_names_what_is_wrong() -> None:
    pol = load_policy(None)
    bad = working_day_series(days=3)
    bad.loc[5, "value"] = -1.0
    with pytest.raises(TraceError, match="series team: negative demand"):
        replay(bad, pol)
    with pytest.raises(GpuCostError, match="--step 420s: must divide an hour"):
        replay(working_day_series(days=3), pol, ReplaySettings(step_s=420))
    with pytest.raises(GpuCostError, match="--nodes 0"):
        replay(working_day_series(days=3), pol, ReplaySettings(nodes=0))
    with pytest.raises(Exception, match="Mars/Olympus"):
        replay(working_day_series(days=3), pol, ReplaySettings(timezone="Mars/Olympus"))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "power", "replay", *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))


@pytest.mark.slow
def test_the_command_prints_one_json_object_with_the_contract_keys(tmp_path: Path) -> None:
    path = tmp_path / "series.csv"
    s = pd.concat([working_day_series(days=4), working_day_series(days=4, day_gpus=20.0, key="small")])
    s.assign(ts=pd.to_datetime(s["ts"], unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ")).to_csv(path, index=False)
    proc = _cli("--series", str(path), "--gpus-per-node", "4", "--json", "--suspend-times", "30m,2h",
                "--quantiles", "0.8", "--plot", str(tmp_path / "frontiers.png"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert set(out["strategies"]) == {"slurm_reactive", "offhours", "forecast"}
    for fig in out["strategies"].values():
        for key in ("node_hours_off", "kwh_saved", "gpu_hours_waited", "max_wait_s"):
            assert isinstance(fig[key], (int, float)), key
    assert [p["suspend_time_s"] for p in out["frontiers"]["slurm_reactive"]] == [1800.0, 7200.0]
    assert [p["forecast_quantile"] for p in out["frontiers"]["forecast"]] == [0.8, 0.9]
    assert out["oracle"]["points"][0]["gpu_hours_waited"] == 0
    assert Path(out["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # summed over the keys
    total = sum(out["keys"][k]["slurm_reactive"]["node_hours_off"] for k in ("team", "small"))
    assert out["strategies"]["slurm_reactive"]["node_hours_off"] == pytest.approx(total, abs=0.05)
    assert out["keys"]["team"]["nodes"] == 16 and out["keys"]["small"]["nodes"] == 5
    text = _cli("--series", str(path), "--gpus-per-node", "4")
    assert text.returncode == 0 and "slurm_reactive" in text.stdout and "forecast" in text.stdout
    bare = _cli("--series", str(path), "--boot", "10")
    assert bare.returncode != 0 and "--boot" in bare.stderr
    bad = _cli("--series", str(path), "--quantiles", "0.9,lots")
    assert bad.returncode != 0 and "--quantiles: 'lots' is not a number" in bad.stderr


@pytest.mark.slow
def test_on_real_team_demand_the_forecast_cuts_the_waiting_for_boots(shared_data: Path) -> None:
    series = history.load_series(shared_data / "helios_vc_demand_hourly.csv")
    two = series[series["key"].isin(["vcJLV", "vcSoL"])]
    out = replay(two, load_policy(None))
    r, f, o = (out["strategies"][k] for k in ("slurm_reactive", "forecast", "offhours"))
    assert r["gpu_hours_waited"] > 0 and f["gpu_hours_waited"] <= 0.7 * r["gpu_hours_waited"]
    assert f["node_hours_off"] > o["node_hours_off"] > 0
    assert out["verdict"].startswith("forecast ")


def test_a_different_policy_changes_the_agents_strategies_not_slurms() -> None:
    pol = load_policy(None)
    off = dataclasses.replace(pol, offhours=dataclasses.replace(pol.offhours, enabled=False))
    a, b = replay(working_day_series(days=4), pol), replay(working_day_series(days=4), off)
    assert a["strategies"]["slurm_reactive"] == b["strategies"]["slurm_reactive"]
    assert b["strategies"]["offhours"]["node_hours_off"] == 0 < a["strategies"]["offhours"]["node_hours_off"]


# -- frontiers, the oracle, and comparing at equal waiting -----------------------------------------
def test_the_oracle_knows_every_gap_and_bounds_every_strategy(daily: dict) -> None:  # type: ignore[type-arg]
    # 7 of the 8 nodes idle 18:00-09:00: the first night from the start (9 h), 20 nights of 15 h, the
    # last evening to the end (6 h, no boot needed); each gap but the last gives a 10-minute boot back
    assert daily["oracle"]["zero_wait_node_hours"] == pytest.approx(7 * ((9 - 1 / 6) + 20 * (15 - 1 / 6) + 6), abs=0.01)
    oracle = daily["oracle"]["points"]
    for name in ("slurm_reactive", "forecast"):
        for p in daily["frontiers"][name]:
            assert p["node_hours_off"] <= at_waiting(oracle, p["gpu_hours_waited"]) + 0.01, (name, p)
            assert 0 <= p["share_of_oracle"] <= 1.0


def test_slurms_frontier_sweeps_suspend_time_and_the_verdict_compares_at_equal_waiting(daily: dict) -> None:  # type: ignore[type-arg]
    curve = daily["frontiers"]["slurm_reactive"]
    assert [p["suspend_time_s"] for p in curve] == sorted(SUSPEND_TIMES)
    offs = [p["node_hours_off"] for p in curve]
    assert offs == sorted(offs, reverse=True)  # a longer SuspendTime never powers down more
    # every morning waits at SuspendTime below the night's 15 h; at a day and more nothing goes down
    assert curve[0]["gpu_hours_waited"] > 0 and curve[-1]["node_hours_off"] == 0
    key = daily["keys"]["team"]
    fc = key["forecast"]
    eq = key["at_equal_waiting"]
    assert eq["slurm_frontier_node_hours"] == pytest.approx(at_waiting(key["frontiers"]["slurm_reactive"],
                                                                       fc["gpu_hours_waited"]), abs=0.01)
    c = daily["comparison"]
    assert c["forecast_over_frontier"] is None or c["forecast_over_frontier"] > 1.15
    assert c["keys_below_frontier"] == [] and c["reactive_2h_gpu_hours_waited"] > fc["gpu_hours_waited"]
    assert daily["verdict"].startswith("forecast beats Slurm's frontier")
    assert "at or above it on every key" in daily["verdict"]


def test_each_setting_of_the_agents_knob_is_compared_with_slurms_frontier_key_by_key() -> None:
    """Every point of the agent's frontier says how it stands against Slurm's, as the default point does:
    an operator picks the quantile that beats Slurm on every team from one replay."""
    out = replay(pd.concat([synthetic(1, days=12), synthetic(2, days=12)]), load_policy(None),
                 ReplaySettings(suspend_times=(1800.0, 4 * 3600.0, 24 * 3600.0), quantiles=(0.5, 0.9, 0.99)))
    keys = out["keys"]
    for p in out["frontiers"]["forecast"]:
        q = p["forecast_quantile"]
        pts = {k: next(x for x in r["frontiers"]["forecast"] if x["forecast_quantile"] == q) for k, r in keys.items()}
        frontier = {k: at_waiting(keys[k]["frontiers"]["slurm_reactive"], pts[k]["gpu_hours_waited"]) for k in keys}
        assert p["slurm_frontier_node_hours"] == pytest.approx(sum(frontier.values()), abs=0.01)
        total = sum(frontier.values())
        assert p["over_frontier"] == (pytest.approx(p["node_hours_off"] / total, abs=1e-3) if total else None)
        assert p["keys_below_frontier"] == sorted(k for k in keys if pts[k]["node_hours_off"] < frontier[k] - 0.5)
    default = next(p for p in out["frontiers"]["forecast"]
                   if p["forecast_quantile"] == out["settings"]["forecast_quantile"])
    c = out["comparison"]
    assert (default["over_frontier"], default["keys_below_frontier"]) == (c["forecast_over_frontier"],
                                                                          c["keys_below_frontier"])
    assert any(p["over_frontier"] is not None and p["over_frontier"] > 0 for p in out["frontiers"]["forecast"])
    ratio = default["over_frontier"]
    assert f"{'n/a' if ratio is None else f'{ratio:.2f}x'} Slurm's frontier" in table(out)


@pytest.mark.parametrize(("points", "waited", "expected"), [
    ([{"gpu_hours_waited": 10, "node_hours_off": 100}], 5, 50.0),          # from (0, 0): power saving off
    ([{"gpu_hours_waited": 10, "node_hours_off": 100}], 30, 100.0),        # flat past the last point
    ([{"gpu_hours_waited": 10, "node_hours_off": 100}, {"gpu_hours_waited": 20, "node_hours_off": 90},
      {"gpu_hours_waited": 30, "node_hours_off": 160}], 20, 130.0),       # a worse setting is passed over
    ([{"gpu_hours_waited": 0, "node_hours_off": 40}, {"gpu_hours_waited": 10, "node_hours_off": 100}], 0, 40.0),
], ids=["first-segment", "flat", "dominated", "zero-wait"])
def test_a_frontier_is_read_at_a_waiting_level(points, waited, expected) -> None:
    assert at_waiting(points, waited) == pytest.approx(expected)


def synthetic(seed: int, days: int = 21) -> pd.DataFrame:
    """A team with a working day and quieter nights and weekends: its level, hours, night and weekend
    shares, the day's start drifting by an hour and the noise, all drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    ts = START + 3600.0 * np.arange(days * 24)
    level = rng.uniform(24, 160)
    start = int(rng.integers(7, 11))
    end = start + int(rng.integers(7, 11))
    night, weekend = rng.uniform(0.0, 0.2), rng.uniform(0.05, 0.4)
    drift = rng.integers(-1, 2, size=days)
    shape = np.zeros(len(ts))
    h = np.arange(24)
    for d in range(days):
        base = np.where((h >= start + drift[d]) & (h < end + drift[d]), 1.0, night)
        shape[d * 24:(d + 1) * 24] = base * (weekend if d % 7 >= 5 else 1.0)
    v = np.clip(level * shape * rng.normal(1.0, rng.uniform(0.05, 0.25), len(ts)), 0, None)
    return pd.DataFrame({"ts": ts, "key": f"team{seed}", "value": np.round(v, 1)})


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(16), ids=[f"seed{s}" for s in range(16)])
def test_on_seasonal_demand_the_forecast_stays_above_slurms_frontier_at_equal_waiting(seed: int) -> None:
    out = replay(synthetic(seed), load_policy(None), ReplaySettings(quantiles=()))
    row = out["keys"][f"team{seed}"]
    fc, eq = row["forecast"], row["at_equal_waiting"]
    assert fc["node_hours_off"] >= eq["slurm_frontier_node_hours"], (fc, eq)
    assert fc["node_hours_off"] <= eq["oracle_node_hours"] + 0.01
    # and it waits less than Slurm's own setting of two hours
    two_h = next(p for p in row["frontiers"]["slurm_reactive"] if p["suspend_time_s"] == 7200.0)
    assert fc["gpu_hours_waited"] <= two_h["gpu_hours_waited"]
