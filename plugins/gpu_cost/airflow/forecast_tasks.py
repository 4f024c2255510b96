"""Task bodies of ``gpu_forecast_nightly``: each returns small JSON for XCom; data lives in the audit store.

Nothing here imports pandas or Prophet at module level (the DAG file imports this module at parse
time); :mod:`gpu_cost.capacity.forecast.nightly` does the work inside the tasks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_cost.airflow import runtime

logger = logging.getLogger(__name__)


def _instant(context: Mapping[str, Any], policy: Any) -> float:
    """Return the run's data instant floored to the hour (a retried task sees the same window)."""
    t = runtime.data_instant(context, policy)
    return float(t // 3600 * 3600)


#: where the nightly run's configured history source comes from before the policy's ``sweep.source``
SOURCE_ENV = ("GPU_COST_FORECAST_SOURCE", *runtime.SOURCE_ENV)
#: the folder a run's ``jobs`` param names a trace of (``GPU_COST_TRACE_DIR``; default ``<GPU_COST_HOME>/traces``)
TRACE_DIR_ENV = "GPU_COST_TRACE_DIR"


def trace_dir() -> Path:
    """Return the deployment's trace folder: the only place a run's ``jobs`` param may name a file of."""
    from gpu_cost.core import paths

    override = os.environ.get(TRACE_DIR_ENV)
    return Path(override) if override else paths.state_dir() / "traces"


def jobs_trace(name: str | None) -> str | None:
    """Return the jobs trace file the run's ``jobs`` param names under :func:`trace_dir` (None: none given).

    Raises :class:`~gpu_cost.airflow.runtime.RunParamError` for a path, a URL, ``..``, a symlink
    out of the folder, or a name the folder does not hold.
    """
    if not name:
        return None
    root = trace_dir()
    found = Path(runtime.under_root(root, name, param="jobs", nested=True))
    if not found.is_file():
        raise runtime.RunParamError("jobs", name, f"no such trace file under {root} ({TRACE_DIR_ENV})")
    return str(found)


def extract(params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Read the job history, store it and the hourly demand series; return the series keys.

    A bad ``jobs`` param fails the run here, before anything is read, with no retry.
    """
    from airflow.sdk.exceptions import AirflowFailException

    from gpu_cost.capacity.forecast import nightly

    store = runtime.store()
    run_id = runtime.audit_run_id(context)
    policy = runtime.pin_policy(store, run_id, params)  # every later task of the run reads this one
    try:
        jobs_path = jobs_trace(params.get("jobs"))
    except runtime.RunParamError as exc:  # a bad param does not fix itself in a retry delay
        raise AirflowFailException(str(exc)) from exc
    if not policy.forecast.enabled:
        logger.info("forecast disabled in %s: nothing to do", policy.source)
        return {"now": _instant(context, policy), "keys": [], "disabled": True, "run_id": run_id}
    source = runtime.source_from(policy, params, env=SOURCE_ENV)
    now = _instant(context, policy)
    ref = nightly.extract(policy, now, str(source), store, jobs_path=jobs_path, run_id=run_id)
    ref["run_id"] = run_id
    return ref


def batches(ref: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Split the series into batches of ``policy.forecast.series_per_task`` (the mapped task's inputs)."""
    from gpu_cost.capacity.forecast import nightly

    policy = runtime.run_policy(runtime.store(), ref["run_id"])
    out = nightly.make_batches(ref, policy.forecast.series_per_task, policy.forecast.horizon)
    logger.info("%d series in %d batch(es) of up to %d", len(ref.get("keys", [])), len(out),
                policy.forecast.series_per_task)
    return out


def fit_batch(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Forecast one batch of series; upsert their ``demand:<key>`` rows."""
    from gpu_cost.capacity.forecast import nightly, prophet_util

    prophet_util.silence()
    return nightly.fit_batch(runtime.store(), batch)


def fit_runtime(ref: Mapping[str, Any]) -> dict[str, Any]:
    """Fit the job end-time model; upsert its class rows and running-job ETAs."""
    from gpu_cost.capacity.forecast import nightly, prophet_util

    if ref.get("disabled"):
        return {"classes": 0, "running_jobs": 0, "backtest": None, "disabled": True}
    prophet_util.silence()
    store = runtime.store()
    return nightly.fit_runtime(store, runtime.run_policy(store, ref["run_id"]), float(ref["now"]), run_id=ref["run_id"])


def finish(ref: Mapping[str, Any], results: Sequence[Mapping[str, Any]], runtime_out: Mapping[str, Any]) -> dict[str, Any]:
    """Write the backtest rows; return the night's figures (the DAG's XCom result)."""
    from gpu_cost.capacity.forecast import nightly

    return nightly.finish(runtime.store(), float(ref["now"]), runtime.mapped_values(results), runtime_out,
                          run_id=ref.get("run_id"))


def train_verifier(ref: Mapping[str, Any]) -> dict[str, Any]:
    """Label the recent decisions with their outcomes and train the verifier at the run's data instant."""
    from gpu_cost.learn import verifier

    store = runtime.store()
    policy = runtime.run_policy(store, ref["run_id"])
    if not policy.verifier.enabled:
        logger.info("verifier disabled in %s: nothing to train", policy.source)
        return {"disabled": True}
    return verifier.train(store, policy, float(ref["now"]), run_id=ref["run_id"])


def rightsize(ref: Mapping[str, Any]) -> dict[str, Any]:
    """Compute the right-sizing advice at the run's data instant, write the advice file, store the rows."""
    from gpu_cost.capacity import rightsize as advice

    store = runtime.store()
    policy = runtime.run_policy(store, ref["run_id"])
    if not policy.rightsize.enabled:
        logger.info("right-sizing disabled in %s: nothing to write", policy.source)
        return {"disabled": True}
    return advice.publish(store, policy, float(ref["now"]), run_id=ref["run_id"])
