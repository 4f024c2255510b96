"""The forecast commands on a slice of the real traces: one JSON object each, and better than the baselines.

The full-size figures (ThetaGPU split 2023-05-01, Helios last 7 days) are the bench's and README's;
here a slice keeps the suite fast while still using real data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cost.capacity.forecast import history
from gpu_cost.core.timeutil import epoch

pytestmark = pytest.mark.slow  # each test runs the CLI on real traces: 5-50 s


def _cli(*args: str, env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    proc = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "forecast", *args, "--json"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(lines) == 1, f"expected one JSON line on stdout, got: {proc.stdout[:800]}"
    return json.loads(lines[0])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def theta_slice(shared_data: Path, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    jobs = history.load_jobs(shared_data / "thetagpu_jobs.csv")
    sl = jobs[(jobs["submit_ts"] >= epoch("2023-04-01")) & (jobs["submit_ts"] < epoch("2023-05-08"))]
    path = tmp_path_factory.mktemp("theta") / "jobs.csv"
    sl.to_csv(path, index=False)
    return path


def test_backtest_command_beats_the_time_limit(theta_slice: Path) -> None:
    out = _cli("backtest", "--jobs", str(theta_slice), "--split", "2023-05-01")
    for key in ("n_test", "mae_s", "baseline_limit_mae_s", "underpredict_rate", "p90_coverage", "p90_pinball_s",
                "baseline_limit_p90_pinball_s"):
        assert key in out, key
    assert out["n_test"] > 300
    assert out["mae_s"] < 0.5 * out["baseline_limit_mae_s"]
    assert out["mae_s"] < out["baseline_user_limit_median_mae_s"]
    assert out["p90_pinball_s"] < 0.9 * out["baseline_limit_p90_pinball_s"]
    assert out["p90_coverage"] >= 0.85


def test_demand_backtest_command_beats_seasonal_naive(shared_data: Path, tmp_path: Path) -> None:
    series = history.load_series(shared_data / "helios_vc_demand_hourly.csv")
    sl = series[series["ts"] < series["ts"].min() + 21 * 86400]
    path = tmp_path / "series.csv"
    sl.to_csv(path, index=False)
    out = _cli("demand-backtest", "--series", str(path), "--horizon", "48h")
    assert out["n_series"] == 8 and out["horizon"] == 48
    assert out["smape"] < out["seasonal_naive_smape"]
    assert set(out["series"]) == set(sl["key"])
    assert 0 <= out["hindsight_flat_smape"] <= 200
    daily = _cli("demand-backtest", "--series", str(path), "--horizon", "2d", "--refit-every", "1d")
    assert daily["refit_every"] == 24 and daily["horizon"] == 48
    assert daily["smape"] < daily["seasonal_naive_smape"]


def test_nightly_then_eta_from_the_stored_forecasts(theta_slice: Path, tmp_path: Path) -> None:
    env = {"AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")})}
    at = "2023-05-03T12:00:00Z"
    out = _cli("nightly", "--source", "trace", "--jobs", str(theta_slice), "--at", at, env=env)
    assert out["demand"]["series"] >= 2 and out["runtime"]["classes"] > 0 and out["runtime"]["running_jobs"] > 0
    jobs = history.load_jobs(theta_slice)
    t = epoch(at)
    running = jobs[(jobs["start_ts"] <= t) & (jobs["end_ts"] > t)].iloc[0]
    eta = _cli("eta", "--job", str(running["job_id"]), "--jobs", str(theta_slice), "--at", at, env=env)
    assert eta["job_id"] == str(running["job_id"]) and not eta["ended"]
    assert running["start_ts"] < eta["p50_end"] <= eta["p90_end"] <= running["start_ts"] + running["time_limit_s"]
    assert eta["basis"].startswith("job forecast")
    # an unknown job is a clear error, as JSON too
    proc = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "forecast", "eta", "--job", "nope", "--jobs",
                           str(theta_slice), "--json"], capture_output=True, text=True, env={**os.environ, **env})
    assert proc.returncode == 2 and "nope" in json.loads(proc.stdout)["error"]


@pytest.mark.parametrize("refit", [["--refit-every", "24h"], []], ids=["refitted-daily-as-the-nightly", "one-forecast"])
def test_demand_backtest_reports_wape_and_never_loses_to_the_best_naive(shared_data: Path, refit: list[str]) -> None:
    """The shipped Helios file, last week held out: WAPE next to sMAPE, and within 5 % of the best naive per series."""
    out = _cli("demand-backtest", "--series", str(shared_data / "helios_vc_demand_hourly.csv"), "--horizon", "168h",
               *refit)
    assert out["n_series"] == 8 and out["horizon"] == 168
    assert out["refit_every"] == (24 if refit else None)
    for key, s in {"overall": out, **out["series"]}.items():
        for k in ("wape", "best_naive_wape", "gpu_hours_short", "gpu_hours_idle", "smape",
                  "best_naive_gpu_hours_short", "best_naive_gpu_hours_idle"):
            assert isinstance(s[k], float) and s[k] >= 0, (key, k)
        assert s["best_naive_wape"] <= min(s["seasonal_naive_wape"], s["daily_repeat_wape"]) + 1e-9, key
        assert s["wape"] <= 1.05 * s["best_naive_wape"], f"{key}: WAPE {s['wape']} vs best naive {s['best_naive_wape']}"
    for key, s in out["series"].items():
        assert sum(s["models"].values()) == (7 if refit else 1), key
        fell = sum(n for m, n in s["models"].items() if m.endswith("(fallback)"))
        assert len(s["fallbacks"]) == fell and all("did not beat it" in why for why in s["fallbacks"]), key
    assert out["fallback_series"] == sorted(k for k, s in out["series"].items() if s["fallbacks"])
