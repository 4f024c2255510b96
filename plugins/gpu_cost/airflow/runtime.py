"""What every DAG task needs: the policy, the audit store and the data instant of the run."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpu_cost.policy import load_policy
from gpu_cost.policy.schema import Policy
from gpu_cost.timeutil import epoch

if TYPE_CHECKING:  # SQLAlchemy and the store are imported where used: DAG files import this at parse time
    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)


def policy_from(params: Mapping[str, Any] | None = None) -> Policy:
    """Load the policy named by the run's ``policy`` param, ``GPU_COST_POLICY``, or the default."""
    path = (params or {}).get("policy") or os.environ.get("GPU_COST_POLICY") or None
    return load_policy(path)


def source_from(policy: Policy, params: Mapping[str, Any] | None = None) -> str:
    """Return the source: the run's ``source`` param, ``GPU_COST_SOURCE``, or the policy's."""
    chosen = (params or {}).get("source") or os.environ.get("GPU_COST_SOURCE") or policy.sweep.source
    return str(chosen)


def data_instant(context: Mapping[str, Any], policy: Policy) -> float:
    """Return the instant a run looks at: the end of its data interval, else when it was due.

    Floored to the sample interval so a retried task sees exactly the same data window.
    """
    candidates = [context.get("data_interval_end"), context.get("logical_date")]
    dag_run = context.get("dag_run")
    if dag_run is not None:
        candidates.append(getattr(dag_run, "run_after", None))
    for value in candidates:
        if value is not None:
            t = epoch(value)
            step = policy.sweep.sample_interval
            return float(t // step * step)
    raise RuntimeError("the run has neither a data interval nor a run_after instant")


def audit_run_id(context: Mapping[str, Any]) -> str:
    """Return the audit store's id for this DAG run."""
    dag_run = context.get("dag_run")
    dag_id = getattr(dag_run, "dag_id", None) or context.get("dag").dag_id  # type: ignore[union-attr]
    run_id = getattr(dag_run, "run_id", None) or context.get("run_id")
    return f"{dag_id}:{run_id}"


def store() -> AuditStore:
    """Return the audit store (connection ``gpu_cost_db``), schema ensured."""
    from gpu_cost.audit.store import AuditStore

    return AuditStore().ensure_schema()
