"""Task bodies of ``gpu_policy_tune``: plan → tune → report.

The trace is the audit store's own usage rows (:func:`gpu_cost.report.usage_trace.trace_from_usage`)
over the ``days`` before the run; the search space is a file of the deployment's tune folder
(``GPU_COST_TUNE_DIR``, default ``include/tune``) named by the run, never a path; the report goes
under the weekly report's root (``GPU_COST_REPORT_DIR``, else the policy's ``report.out_dir``), in
``tune/<date>_<space>_<days>d/``. Every task works its inputs out again from the run's params and
pinned policy: XCom carries a summary, never a path a later task would trust. Nothing here writes
a policy file other than ``proposed.yaml`` in the report folder: the running policy is unchanged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_cost.airflow import runtime
from gpu_cost.core import paths
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.timeutil import iso, utc

logger = logging.getLogger(__name__)

#: the deployment's folder of search spaces (a run names one of its files)
TUNE_DIR_ENV = "GPU_COST_TUNE_DIR"
DEFAULT_SPACE = "default"
#: bounds of the ``days`` param: the history replayed
MIN_DAYS, MAX_DAYS, DEFAULT_DAYS = 1, 90, 14


def space_dir() -> Path:
    """Return the folder of search spaces: ``GPU_COST_TUNE_DIR``, else the shipped ``include/tune``."""
    override = os.environ.get(TUNE_DIR_ENV)
    return Path(override) if override else paths.include_dir() / "tune"


#: the search spaces the package ships in ``include/tune/``, with what each tunes: constant for a release, so
#: the form offers them without listing the tune folder at parse time (:func:`runtime.name_param`)
SHIPPED_SPACES: dict[str, str] = {"default": "the shipped space: idle-allocation and zombie windows, thresholds "
                                             "and ladder delays, baselines on or off"}


def space_param() -> Any:
    """Return the ``space`` field of the tune form: a name of :func:`space_dir`, checked when the run starts."""
    return runtime.name_param(DEFAULT_SPACE, SHIPPED_SPACES, title="Search space",
                              what=f"A search space of the deployment's tune folder ({TUNE_DIR_ENV}), by name, "
                                   "never a path.")


def space_names() -> list[str]:
    """Return the search spaces a run may name (file stems of :func:`space_dir`); read when a run starts, never
    when the DAG file is parsed."""
    return runtime.named_files(space_dir())


def resolve_space(name: object) -> Path:
    """Return the file of the search space a run names; a path, or a name the folder does not hold, is refused."""
    found = runtime.named_file(space_dir(), name or DEFAULT_SPACE, param="space")
    if found is None:
        raise PolicyError(str(name), "space", f"not a search space of the deployment's tune folder {space_dir()} "
                                              f"(a run names one, never a path; available: "
                                              f"{', '.join(space_names()) or 'none'})")
    return found


def _plan(params: Mapping[str, Any], context: Mapping[str, Any], policy: Any) -> dict[str, Any]:
    """Return the run's window, space file and report folder, from its params and instant alone."""
    from gpu_cost.report.render import _root, out_location

    days = int(params.get("days") or DEFAULT_DAYS)
    if not MIN_DAYS <= days <= MAX_DAYS:
        raise runtime.RunParamError("days", days, f"must be {MIN_DAYS} to {MAX_DAYS}")
    space = str(params.get("space") or DEFAULT_SPACE)
    space_file = resolve_space(space)
    until = runtime.data_instant(context, policy)
    name = f"{utc(until):%Y-%m-%d}_{space_file.stem}_{days}d"
    folder = _root(out_location(policy)) / "tune" / name
    return {"since": until - days * 86400.0, "until": until, "days": days, "space": space_file.stem,
            "space_file": space_file, "folder": folder}


def plan(params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Pin the run's policy and check its params; return the window and where the report goes.

    A bad param fails the run here, before anything is replayed, with no retry.
    """
    from airflow.sdk.exceptions import AirflowFailException

    run_id = runtime.audit_run_id(context)
    policy = runtime.pin_policy(runtime.store(), run_id, params)
    try:
        p = _plan(params, context, policy)
    except (runtime.RunParamError, PolicyError) as exc:  # a bad param does not fix itself in a retry delay
        raise AirflowFailException(str(exc)) from exc
    return {"run_id": run_id, "since": iso(p["since"]), "until": iso(p["until"]), "days": p["days"],
            "space": p["space"], "folder": str(p["folder"])}


def run_tune(params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild the trace from the store's usage rows, replay the candidates and write the report; return a summary."""
    import time

    from gpu_cost.report.usage_trace import trace_from_usage
    from gpu_cost.sim.replay import prepare
    from gpu_cost.sim.tune import load_space, tune, write_report

    store = runtime.store()
    run_id = runtime.audit_run_id(context)
    policy = runtime.run_policy(store, run_id)  # checks the pinned content's hash
    base_text = str(store.fetch("pinned_policy", {"run_id": run_id})[0]["content"])
    p = _plan(params, context, policy)
    space = load_space(p["space_file"], base_text, policy.source)
    t0 = time.time()
    trace = trace_from_usage(store, p["since"], p["until"], policy)
    prepared = prepare([trace.samples], trace.jobs, None, notes=trace.notes)
    del trace
    result = tune(prepared, base_text, policy.source, space, max_candidates=int(params.get("max_candidates") or 48),
                  seed=int(params.get("seed") or 0), prepare_seconds=time.time() - t0)
    written = write_report(result, p["folder"], {"window": {"since": iso(p["since"]), "until": iso(p["until"]),
                                                            "days": p["days"]}, "run_id": run_id})
    chosen = result.chosen
    return {**written, "search": result.search, "candidates": len(result.tried) - 1, "pareto": result.pareto,
            "chosen": chosen.name if chosen else None, "reason": result.reason}
