"""Helpers shared by the rules: per-job GPU views and inference recognition."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import numpy as np
import pandas as pd

from gpu_cost.model import Job
from gpu_cost.policy.schema import InferenceConfig


def job_rows(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Return row positions per attributed job id."""
    ids = frame["job_id"].to_numpy(dtype=object)
    out: dict[str, list[int]] = {}
    for pos, jid in enumerate(ids):
        if jid is not None and jid == jid and jid != "":
            out.setdefault(str(jid), []).append(pos)
    return {k: np.array(v) for k, v in out.items()}


def declared_inference(job: Job, cfg: InferenceConfig) -> str | None:
    """Return why the policy declares ``job`` an inference service, or None."""
    if job.partition and job.partition in cfg.partitions:
        return f"partition {job.partition}"
    for pat in cfg.name_patterns:
        if job.name and fnmatch.fnmatchcase(job.name.lower(), pat.lower()):
            return f"name matches {pat}"
    for label in cfg.labels:
        if label in job.labels:
            return f"label {label}"
    return None


def behaves_like_inference(bursts: Iterable[int], cfg: InferenceConfig) -> bool:
    """Return True when the GPUs show repeated idle→busy bursts within the lookback."""
    values = [int(b) for b in bursts]
    return bool(values) and max(values) >= cfg.min_bursts


def job_fields(job: Job) -> dict[str, object]:
    """Return the Finding fields that describe a job."""
    return {
        "job_id": job.job_id,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "qos": job.qos,
        "name": job.name,
        "labels": job.labels,
        "nodes": job.nodes,
        "job_start_ts": job.start_ts,
        "time_limit_s": job.time_limit_s,
    }


def r(value: float, digits: int = 1) -> float | None:
    """Round for evidence; NaN becomes None so evidence stays valid JSON."""
    if value is None or value != value:
        return None
    return round(float(value), digits)
