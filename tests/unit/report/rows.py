"""The usage record's columns read a row at a time, as the tests compare them (the agent writes columns)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Snapshot
from gpu_cost.report.usage import JOB_USAGE_KEYS, USAGE_KEYS, job_usage_columns, usage_columns


def as_rows(columns: dict[str, Any], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Return columns (one value for every row where a column is not a list) as rows, keys in ``keys``' order."""
    n = max((len(v) for v in columns.values() if isinstance(v, list)), default=0)
    cols = [columns[k] if isinstance(columns[k], list) else [columns[k]] * n for k in keys]
    return [dict(zip(keys, values, strict=True)) for values in zip(*cols, strict=True)]


def usage_rows(snapshot: Snapshot, policy: Policy, interval_s: float | None = None) -> list[dict[str, Any]]:
    """The ``gpu_cost_usage`` rows of one sweep."""
    return as_rows(usage_columns(snapshot, policy, interval_s), USAGE_KEYS)


def job_usage_rows(snapshot: Snapshot, policy: Policy, interval_s: float | None = None) -> list[dict[str, Any]]:
    """The ``gpu_cost_jobs_usage`` rows of one sweep."""
    return as_rows(job_usage_columns(snapshot, policy, interval_s), JOB_USAGE_KEYS)
