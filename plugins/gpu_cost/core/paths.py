"""Where the package finds its shipped files (policies, SQL, scenarios, templates)."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository (or deployment) root: ``plugins/gpu_cost`` lives two levels below it.
ROOT = Path(__file__).resolve().parents[3]


def include_dir() -> Path:
    """Return the ``include/`` folder; ``GPU_COST_INCLUDE`` overrides it (e.g. in containers)."""
    override = os.environ.get("GPU_COST_INCLUDE")
    return Path(override) if override else ROOT / "include"


def dags_dir() -> Path:
    """Return the folder holding the DAG files."""
    override = os.environ.get("GPU_COST_DAGS")
    return Path(override) if override else ROOT / "dags"


def default_policy() -> Path:
    """Return the policy used when nothing else is configured (``GPU_COST_POLICY`` overrides)."""
    override = os.environ.get("GPU_COST_POLICY")
    return Path(override) if override else include_dir() / "policy" / "default.yaml"


def default_scenario() -> Path:
    """Return the simulator scenario used by default (``GPU_COST_SCENARIO`` overrides)."""
    override = os.environ.get("GPU_COST_SCENARIO")
    return Path(override) if override else include_dir() / "scenarios" / "default.yaml"


def state_dir() -> Path:
    """Return the folder for local state (the SQLite audit file by default)."""
    override = os.environ.get("GPU_COST_HOME")
    return Path(override) if override else Path.home() / ".gpu_cost"
