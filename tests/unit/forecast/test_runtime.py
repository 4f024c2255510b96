"""The job end-time model: no leakage, never above the limit, better than the limit, usable by the sweep."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_cost.capacity.forecast import backtest, runtime
from gpu_cost.core.model import Job
from tests.unit.forecast.conftest import synthetic_jobs


def test_features_only_see_jobs_finished_before_submit(jobs) -> None:  # type: ignore[no-untyped-def]
    target = jobs.iloc[[800]].copy()
    X1, level1, _ = runtime.features(target, jobs)
    # change every job that ended after the target's submit: its features must not move
    later = jobs["end_ts"] >= float(target["submit_ts"].iloc[0])
    changed = jobs.copy()
    changed.loc[later, "end_ts"] = changed.loc[later, "start_ts"] + 1.0
    X2, level2, _ = runtime.features(target, changed)
    assert level1[0] == level2[0] == 0
    np.testing.assert_array_equal(X1, X2)


def test_predictions_beat_the_limit_and_stay_below_it(jobs) -> None:  # type: ignore[no-untyped-def]
    split = float(jobs["submit_ts"].quantile(0.7))
    out = backtest.runtime_backtest(jobs, split, use_prophet=False)
    assert out["n_test"] > 300
    assert out["mae_s"] < 0.6 * out["baseline_limit_mae_s"]
    assert out["p90_pinball_s"] < out["baseline_limit_p90_pinball_s"]
    assert out["p90_coverage"] >= 0.8
    model = runtime.fit(jobs[jobs["end_ts"] < split], now=split, use_prophet=False)
    test = jobs[jobs["start_ts"] >= split]
    pred = runtime.predict(model, test, history=jobs)
    lim = test["time_limit_s"].to_numpy()
    assert (pred["p90_s"].to_numpy() <= lim + 1e-6).all()
    assert (pred["p50_s"].to_numpy() <= pred["p90_s"].to_numpy() + 1e-6).all()


def test_prophet_classes_are_chosen_per_class_and_recorded() -> None:
    # spread over 40 days so the busiest classes qualify for their own Prophet fit
    jobs = synthetic_jobs(1200, seed=3)
    jobs[["submit_ts", "start_ts", "end_ts"]] = jobs[["submit_ts", "start_ts", "end_ts"]] * 1.0
    span = jobs["submit_ts"].max() - jobs["submit_ts"].min()
    scale = 40 * 86400 / span
    t0 = jobs["submit_ts"].min()
    dur = jobs["end_ts"] - jobs["start_ts"]
    jobs["submit_ts"] = t0 + (jobs["submit_ts"] - t0) * scale
    jobs["start_ts"] = jobs["submit_ts"] + 60
    jobs["end_ts"] = jobs["start_ts"] + dur
    model = runtime.fit(jobs, min_class_jobs=30)
    assert model.choices, "no class had enough history for Prophet"
    assert {c["method"] for c in model.choices.values()} <= {"prophet", "empirical"}
    scored = [c for c in model.choices.values() if "score_prophet_s" in c]
    assert scored and all(c["score_empirical_s"] > 0 for c in scored)
    assert model.stats.fits >= len(scored)
    assert set(model.prophet) == {k for k, c in model.choices.items() if c["method"] == "prophet"}


def _running(jobs: pd.DataFrame, now: float) -> list[Job]:
    rows = jobs[(jobs["start_ts"] <= now) & (jobs["end_ts"] > now)]
    return [Job(job_id=r.job_id, user=r.user, account=r.account, name=r.name, start_ts=r.start_ts, submit_ts=r.submit_ts,
                time_limit_s=r.time_limit_s, gpus_requested=int(r.gpus)) for r in rows.itertuples()]


def test_predicted_ends_from_model_and_from_store_agree(jobs, store) -> None:  # type: ignore[no-untyped-def]
    now = float(jobs["start_ts"].iloc[1200]) + 1
    model = runtime.fit(jobs, now=now, use_prophet=False)
    running = _running(jobs, now)
    assert running
    ends = runtime.predicted_ends(model, running, now)
    assert set(ends) == {j.job_id for j in running}
    for j in running:
        assert j.start_ts < ends[j.job_id] <= j.start_ts + j.time_limit_s

    store.execute("upsert_forecast", runtime.class_rows(model, now))
    from_store = runtime.predicted_ends(store, running, now)
    assert set(from_store) == set(ends)
    for jid, end in from_store.items():
        job = next(j for j in running if j.job_id == jid)
        assert job.start_ts < end <= job.start_ts + job.time_limit_s

    # a job's own row (written by the nightly run) wins over its class
    frame = jobs.assign(end_ts=jobs["end_ts"].where(jobs["end_ts"] <= now))
    frame = frame[frame["submit_ts"] <= now]
    rows = runtime.job_rows(model, frame, now)
    assert {r["series"] for r in rows} == {f"runtime:job:{j.job_id}" for j in running}
    store.execute("upsert_forecast", rows)
    store.execute("upsert_forecast", rows)  # a re-run keeps one row per job
    n = store.query("SELECT COUNT(*) AS n FROM gpu_cost_forecasts WHERE series LIKE 'runtime:job:%'")[0]["n"]
    assert n == len(running)
    own = runtime.predicted_ends(store, running, now)
    assert own == pytest.approx({r["series"].split(":")[-1]: r["yhat_upper"] for r in rows}, abs=0.2)
    eta = runtime.eta(store, {"job_id": running[0].job_id, "start_ts": running[0].start_ts,
                              "time_limit_s": running[0].time_limit_s}, now)
    assert eta is not None and eta["p50_end"] <= eta["p90_end"] <= eta["limit_end"]


def test_name_template_folds_numbers() -> None:
    assert runtime.name_template("train-123_epoch7") == runtime.name_template("train-9_epoch12") == "train-#_epoch#"
    assert runtime.class_key({"user": "a", "account": "b", "gpus": 8, "time_limit_s": 3600.0}, 1) == \
        "user|user=a|account=b|gpus=8|time=3600"


def test_predicted_ends_skips_jobs_it_cannot_forecast(jobs) -> None:  # type: ignore[no-untyped-def]
    model = runtime.fit(jobs, use_prophet=False)
    pending = Job(job_id="p1", user="u1", state="PENDING", time_limit_s=3600.0)
    no_limit = Job(job_id="n1", user="u1", start_ts=float(jobs["end_ts"].max()))
    assert runtime.predicted_ends(model, [pending, no_limit], float(jobs["end_ts"].max())) == {}


def _running_copy(jobs: pd.DataFrame, i: int, ran_s: float) -> tuple[pd.DataFrame, float]:
    """Job ``i`` as if it were still running ``ran_s`` after its start; return it and that instant."""
    job = jobs.iloc[[i]].copy()
    job["end_ts"] = np.nan
    job["state"] = "RUNNING"
    return job, float(job["start_ts"].iloc[0]) + ran_s


def test_a_running_job_is_forecast_given_how_long_it_has_run(jobs) -> None:  # type: ignore[no-untyped-def]
    """A job that has already run past what its class usually takes is not forecast to end in the past:
    its quantiles are those of the similar jobs that ran longer, between now and its limit."""
    model = runtime.fit(jobs.iloc[:1200], use_prophet=False)
    i = 1300
    lim = float(jobs["time_limit_s"].iloc[i])
    submit = runtime.predict(model, jobs.iloc[[i]], history=jobs.iloc[:1200]).iloc[0]
    ran = min(float(submit["p90_s"]) * 1.05 + 60, 0.97 * lim)  # past the unconditional p90
    job, now = _running_copy(jobs, i, ran)
    given = runtime.predict(model, job, history=jobs.iloc[:1200], now=now).iloc[0]
    assert ran <= given["p50_s"] <= given["p90_s"] <= lim + 1e-6, (submit.to_dict(), given.to_dict(), ran)
    assert given["p90_s"] > submit["p90_s"]
    # without ``now`` (a job at submit, as the backtest scores it) nothing changes
    again = runtime.predict(model, job, history=jobs.iloc[:1200]).iloc[0]
    assert again["p50_s"] == pytest.approx(submit["p50_s"]) and again["p90_s"] == pytest.approx(submit["p90_s"])
    # a job that has barely started keeps roughly its submit-time forecast
    early, t = _running_copy(jobs, i, 1.0)
    first = runtime.predict(model, early, history=jobs.iloc[:1200], now=t).iloc[0]
    assert first["p90_s"] == pytest.approx(submit["p90_s"], rel=0.05)


def test_a_job_that_outlived_every_similar_job_is_expected_to_run_to_its_limit() -> None:
    """When no training job of its kind ran as long, the honest answer is the limit, named as such."""
    jobs = synthetic_jobs(600, seed=5)
    jobs["end_ts"] = jobs["start_ts"] + 0.5 * jobs["time_limit_s"]  # every job used half its limit
    model = runtime.fit(jobs.iloc[:500], use_prophet=False)
    job, now = _running_copy(jobs, 550, 0.8 * float(jobs["time_limit_s"].iloc[550]))
    out = runtime.predict(model, job, history=jobs.iloc[:500], now=now).iloc[0]
    lim = float(jobs["time_limit_s"].iloc[550])
    assert out["method"] == "limit" and out["p50_s"] == pytest.approx(lim) and out["p90_s"] == pytest.approx(lim)
    ends = runtime.predicted_ends(model, job.to_dict("records"), now)
    assert ends[str(job["job_id"].iloc[0])] == pytest.approx(float(job["start_ts"].iloc[0]) + lim)
