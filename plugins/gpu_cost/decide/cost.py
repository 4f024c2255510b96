"""The cost of being wrong, and the value of being right, for one decision."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_cost.core.model import Finding

#: when neither a forecast nor a time limit bounds the waste, count this much ahead
DEFAULT_HORIZON_S = 24 * 3600.0


@dataclass(frozen=True)
class Stakes:
    """GPU-hours a decision puts at risk and GPU-hours it frees."""

    at_risk: float
    saved: float
    basis: str


def stakes(f: Finding, now: float, predicted_end: float | None = None,
           open_ended: float = DEFAULT_HORIZON_S) -> Stakes:
    """Return the stakes of acting on ``f`` at ``now``.

    GPUs are whole-GPU equivalents (:attr:`~gpu_cost.core.model.Finding.gpu_equivalents`: a 1g.10gb slice
    is 1/7). At risk: GPUs x how long the job (or process) has run — the work lost if it was not waste.
    Saved: GPUs x time until it would end anyway — the forecast p90 end when known, else the
    time limit, else ``open_ended`` seconds (the policy's ``cost.open_ended``).
    """
    started = f.job_start_ts
    if f.target_kind == "process":
        started = f.evidence.get("process_start_ts") or started
    ran = max(0.0, now - float(started)) if started else 0.0
    ends = []
    basis = "default horizon"
    if predicted_end is not None and predicted_end > now:
        ends.append(predicted_end)
        basis = "forecast p90"
    if f.time_limit_s and f.job_start_ts and f.target_kind == "job":
        ends.append(f.job_start_ts + f.time_limit_s)
        if basis == "default horizon":
            basis = "time limit"
    end = min(ends) if ends else now + open_ended
    remaining = max(0.0, end - now)
    gpus = f.gpu_equivalents  # a MIG slice costs its share of the GPU
    return Stakes(at_risk=gpus * ran / 3600.0, saved=gpus * remaining / 3600.0, basis=basis)
