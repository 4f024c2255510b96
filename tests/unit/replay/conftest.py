"""The replay tests' fixtures: a policy fit for small clusters, and the ground-truth trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_cost.cli.commands.simtrace import write_scenario_trace
from gpu_cost.config.loader import load_policy
from tests.fixtures.core import ROOT
from tests.unit.replay.support import DAY, END, GROUND_TRUTH, _scenario


@pytest.fixture
def policy():  # type: ignore[no-untyped-def]
    """The shipped policy, with a GPU-share cap fit for these 8- and 16-GPU clusters (10 % of 8 is under one GPU)."""
    import dataclasses

    from gpu_cost.config.schema import Caps

    shipped = load_policy(ROOT / "include" / "policy" / "default.yaml")
    p = dataclasses.replace(shipped, caps=Caps(max_actions_per_run=20, max_gpu_share=0.5))
    object.__setattr__(p, "source", shipped.source)
    return p


@pytest.fixture(scope="session")  # once a worker: tests read it, and write their variants beside it
def truth_trace(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("truth")
    write_scenario_trace(out, _scenario(GROUND_TRUTH), END - DAY, END)
    return out
