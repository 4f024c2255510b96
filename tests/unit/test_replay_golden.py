"""The replay's figures on the shipped scenarios, held against the output recorded before the replay
was rewritten to roll its windows forward (one pass over the trace instead of a lookback recomputed at
every sweep): the same actions, findings, decisions, ledger and figures, to the last rounding.

The expected output (``tests/data/replay/golden.json``) was written by the replay as it was before the
rewrite. A deliberate change of what the replay decides regenerates it:

    python -m tests.unit.test_replay_golden --write
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.cli.commands.simtrace import write_scenario_trace, write_sim_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.sim.cluster import load_scenario
from gpu_cost.sim.replay import replay_files
from tests.fixtures.core import ROOT

GOLDEN = ROOT / "tests" / "data" / "replay" / "golden.json"
END = 1795392000.0  # a fixed instant: the same traces on every run
HOUR = 3600.0


def _policy(variant: str) -> Any:
    policy = load_policy(ROOT / "include" / "policy" / "default.yaml")
    if variant == "baselines-off":
        alone = dataclasses.replace(policy, baselines=dataclasses.replace(policy.baselines, enabled=False))
        object.__setattr__(alone, "source", policy.source)
        return alone
    return policy


#: case -> (how its trace is written, policy variant, replay mode, approvals)
CASES: dict[str, tuple[str, str, str, str]] = {
    "default-scenario": ("scenario", "shipped", "enforce", "approve"),
    "default-scenario-rejected": ("scenario", "shipped", "enforce", "reject"),
    "basic-48-gpus": ("basic", "shipped", "enforce", "approve"),
    "basic-48-gpus-notify": ("basic", "shipped", "notify", "approve"),
    "hard-32-gpus": ("hard", "shipped", "enforce", "approve"),
    "hard-32-gpus-baselines-off": ("hard", "baselines-off", "enforce", "approve"),
}


def _write(kind: str, out: Path) -> Path:
    if (out / "jobs.csv").exists():
        return out
    if kind == "scenario":
        sc = dataclasses.replace(load_scenario(ROOT / "include" / "scenarios" / "default.yaml"), anchor=END)
        write_scenario_trace(out, sc, END - 6 * HOUR, END + 12 * HOUR)
    elif kind == "basic":
        write_sim_trace(out, days=1.0, gpus=48, seed=3, end=END)
    else:
        write_sim_trace(out, days=1.5, gpus=32, seed=0, end=END, behaviours="hard")
    return out


def run_case(name: str, base: Path) -> dict[str, Any]:
    """Return the replay payload of case ``name`` (its traces written under ``base``), minus the wall time."""
    kind, variant, mode, approvals = CASES[name]
    trace = _write(kind, base / kind)
    res = replay_files(trace / "samples.parquet", trace / "jobs.csv", _policy(variant), mode=mode,
                       approvals=approvals).to_dict()
    res.pop("seconds")
    res["policy"] = Path(res["policy"]).relative_to(ROOT).as_posix()  # the checkout's place differs between machines
    # the notes name the trace's folder, which differs between runs
    res["notes"] = [n.replace(str(trace), "<trace>") for n in res["notes"]]
    return json.loads(json.dumps(res))  # tuples as lists, as the file holds them


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("golden")


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return dict(json.loads(GOLDEN.read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_replay_gives_the_recorded_figures(name: str, traces: Path, golden: dict[str, Any]) -> None:
    expected = golden[name]
    got = run_case(name, traces)
    assert got["actions"], "a case that acts on nothing would not test the rolling windows"
    for key in expected:
        assert got[key] == expected[key], f"{name}: {key} differs"
    assert got == expected


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = {name: run_case(name, Path(tmp)) for name in CASES}
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
