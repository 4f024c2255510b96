"""What the replay tests share: the ground-truth scenario, its instants, and reading a replay's kills."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gpu_cost.core.model import KILL_ACTIONS
from gpu_cost.sim.cluster import scenario_from_dict

END = 1795910400.0  # a Monday, 00:00 UTC
DAY = 86400.0


def _scenario(jobs: list[dict]) -> object:
    return scenario_from_dict({
        "seed": 11, "anchor": END,
        "nodes": [{"name": "g1", "gpus": 4, "model": "a100", "mem_total_mib": 40960},
                  {"name": "g2", "gpus": 4, "model": "a100", "mem_total_mib": 40960}],
        "jobs": jobs,
    })


GROUND_TRUTH = [
    # busy all along: never touched
    {"job_id": "101", "user": "ann", "behaviour": "training", "node": "g1", "gpus": [0, 1], "start": "-20h", "name": "train"},
    # ends at -16h, its process lingers 6 h holding memory: a zombie to reclaim
    {"job_id": "102", "user": "bob", "behaviour": "zombie", "node": "g1", "gpus": [2], "start": "-20h", "end": "-16h",
     "linger": "6h", "name": "sweep"},
    # works 30 min, then sits idle until its end at -2h: an idle allocation to reclaim
    {"job_id": "103", "user": "cat", "behaviour": "idle", "node": "g1", "gpus": [3], "start": "-20h", "end": "-2h",
     "busy_first": "30m", "name": "finetune"},
    # a declared inference service (name): bursts every 90 min, never killed
    {"job_id": "104", "user": "dan", "behaviour": "inference", "node": "g2", "gpus": [0, 1], "start": "-22h",
     "name": "serve-chat", "burst_every": "90m", "burst_length": "15m"},
    # idle, but protected by its no-interrupt label
    {"job_id": "105", "user": "eve", "behaviour": "idle", "node": "g2", "gpus": [2], "start": "-20h", "end": "-1h",
     "busy_first": "20m", "comment": "gpu-cost:no-interrupt", "name": "debug"},
    # input-bound, busy enough: advice at most
    {"job_id": "106", "user": "fay", "behaviour": "dataloader", "node": "g2", "gpus": [3], "start": "-20h", "name": "etl"},
]


def _labels(jobs_csv: Path) -> pd.DataFrame:
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    # the trace's labels column carries what the comment said
    return jobs


def _kill_targets(res: dict) -> set[str]:
    """The kills' targets, a process by its host and PID (its start is its first sample seen: a slower scrape sees it
    later)."""
    return {":".join(a["target"].split(":")[:3]) for a in res["actions"] if a["action"] in KILL_ACTIONS}
