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

from gpu_cost.errors import GpuCostError, TraceError
from gpu_cost.forecast import history
from gpu_cost.policy import load_policy
from gpu_cost.power_replay import STRATEGIES, ReplaySettings, replay
from gpu_cost.timeutil import epoch

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
    assert r["kwh_saved"] == pytest.approx(r["node_hours_off"] * 0.4, abs=0.1)
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
    return subprocess.run([sys.executable, "-m", "gpu_cost.cli", "power", "replay", *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))


@pytest.mark.slow
def test_the_command_prints_one_json_object_with_the_contract_keys(tmp_path: Path) -> None:
    path = tmp_path / "series.csv"
    s = pd.concat([working_day_series(days=4), working_day_series(days=4, day_gpus=20.0, key="small")])
    s.assign(ts=pd.to_datetime(s["ts"], unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ")).to_csv(path, index=False)
    proc = _cli("--series", str(path), "--gpus-per-node", "4", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert set(out["strategies"]) == {"slurm_reactive", "offhours", "forecast"}
    for fig in out["strategies"].values():
        for key in ("node_hours_off", "kwh_saved", "gpu_hours_waited", "max_wait_s"):
            assert isinstance(fig[key], (int, float)), key
    # summed over the keys
    total = sum(out["keys"][k]["slurm_reactive"]["node_hours_off"] for k in ("team", "small"))
    assert out["strategies"]["slurm_reactive"]["node_hours_off"] == pytest.approx(total, abs=0.05)
    assert out["keys"]["team"]["nodes"] == 16 and out["keys"]["small"]["nodes"] == 5
    text = _cli("--series", str(path), "--gpus-per-node", "4")
    assert text.returncode == 0 and "slurm_reactive" in text.stdout and "forecast" in text.stdout
    bare = _cli("--series", str(path), "--boot", "10")
    assert bare.returncode != 0 and "--boot" in bare.stderr


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
