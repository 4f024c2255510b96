"""``gpu-cost tune``: the search space is checked like a policy, the Pareto set is exact, the proposal is loadable.

The CLI test replays a 4-candidate grid over a generated day of 16 GPUs (``write_sim_trace``, what
``gpu-cost sim-trace --days 1 --gpus 16`` calls) and checks the JSON contract and ``--write``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_cost.core import paths
from gpu_cost.core.errors import GpuCostError, PolicyError
from gpu_cost.sim.tune import (
    OBJECTIVES,
    Candidate,
    Knob,
    TuneResult,
    candidates,
    choose,
    dominates,
    pareto,
    parse_space,
    render_policy,
    with_overrides,
    write_policy,
)

BASE = paths.default_policy()
BASE_TEXT = BASE.read_text(encoding="utf-8")


def space(text: str):  # type: ignore[no-untyped-def]
    return parse_space(text, "space.yaml", BASE_TEXT, str(BASE))


# -- the search space --------------------------------------------------------------------------------------
def test_the_shipped_space_is_valid_and_larger_than_one_grid_of_48() -> None:
    from gpu_cost.sim.tune import load_space

    s = load_space(paths.include_dir() / "tune" / "default.yaml", BASE_TEXT, str(BASE))
    assert [k.path for k in s.knobs][:2] == ["rules.idle_allocation.window", "rules.idle_allocation.util_max"]
    assert s.grid_size() > 48  # the shipped space is searched at random by default


def test_choices_and_ranges_give_their_grids() -> None:
    s = space("rules.idle_allocation.window: [15m, 30m, 1h]\n"
              "rules.idle_allocation.util_max: {min: 1, max: 10, steps: 4}\n"
              "rules.idle_allocation.ladder[3].after: {min: 30m, max: 2h}\n"
              "evidence.min_confidence: {min: 0.3, max: 0.8, steps: 2}\n")
    grids = {k.path: k.grid() for k in s.knobs}
    assert grids == {"rules.idle_allocation.window": ["15m", "30m", "1h"],
                     "rules.idle_allocation.util_max": [1, 4, 7, 10],
                     "rules.idle_allocation.ladder[3].after": ["30m", "1h15m", "2h"],
                     "evidence.min_confidence": [0.3, 0.8]}
    assert s.grid_size() == 3 * 4 * 3 * 2


@pytest.mark.parametrize(("text", "where", "why"), [
    ("rules.idle_allocation.window: [15m]\nrules.idle_allocation.window: [1h]\n", "line 2",
     "duplicate key 'rules.idle_allocation.window'"),
    ("rules.idle_allocation.windw: [15m]\n", "rules.idle_allocation.windw", "unknown key"),
    ("rules.nope.window: [15m]\n", "rules.nope.window", "unknown key"),
    ("rules.idle_allocation.window: [15m, soon]\n", "rules.idle_allocation.window", "value 'soon'"),
    ("rules.idle_allocation.util_max: [5, 25]\n", "rules.idle_allocation.util_max", "not below the busy threshold"),
    ("rules.idle_allocation.window: [15m, 15m]\n", "rules.idle_allocation.window", "twice"),
    ("rules.idle_allocation.window: []\n", "rules.idle_allocation.window", "empty list"),
    ("rules.idle_allocation.window: 15m\n", "rules.idle_allocation.window", "list of choices or a range"),
    ("rules.idle_allocation.util_max: {min: 8, max: 2}\n", "rules.idle_allocation.util_max", "not below max"),
    ("rules.idle_allocation.util_max: {min: 2, max: 1h}\n", "rules.idle_allocation.util_max", "both be numbers"),
    ("rules.idle_allocation.util_max: {min: 2, max: 8, step: 2}\n", "rules.idle_allocation.util_max.step",
     "unknown key"),
    ("rules.idle_allocation.util_max: {min: 2, max: 8, steps: 1}\n", "rules.idle_allocation.util_max.steps",
     "whole number"),
    ("rules.idle_allocation.util_max: {max: 8}\n", "rules.idle_allocation.util_max.min", "missing"),
    ("rules.idle_allocation.ladder[9].after: [1h]\n", "rules.idle_allocation.ladder.9.after|rules.idle_allocation"
     r".ladder\[9\].after", "item"),
    ("mode: [enforce]\n", "mode", "cannot be tuned"),
    ("rules idle window: [1h]\n", "rules idle window", "not a dotted policy path"),
    ("[1, 2]\n", r"\(top\)", "mapping of dotted policy paths"),
], ids=["duplicate", "unknown-key", "unknown-rule", "bad-duration", "threshold-clash", "choice-twice", "empty",
        "scalar", "min-above-max", "mixed-range", "range-key", "steps", "range-missing", "ladder-index", "mode",
        "not-a-path", "not-a-mapping"])
def test_a_bad_space_is_an_error_naming_the_file_and_the_key(text: str, where: str, why: str) -> None:
    with pytest.raises(PolicyError, match=rf"^space\.yaml: ({where}): .*{why}"):
        space(text)


def test_ranges_draw_inside_their_bounds() -> None:
    rng = random.Random(3)
    ints, durs = Knob("a", low=1, high=10, unit="int"), Knob("b", low=1800, high=7200, unit="duration")
    from gpu_cost.core.timeutil import parse_duration

    for _ in range(200):
        assert 1 <= ints.draw(rng) <= 10
        assert 1800 <= parse_duration(durs.draw(rng)) <= 7200


def test_overrides_set_nested_keys_and_ladder_rungs_without_touching_the_base() -> None:
    raw = yaml.safe_load(BASE_TEXT)
    out = with_overrides(raw, {"rules.idle_allocation.ladder[3].after": "2h", "rules.partly_idle.window": "30m"})
    assert out["rules"]["idle_allocation"]["ladder"][3] == {"action": "terminate", "after": "2h"}
    assert out["rules"]["partly_idle"]["window"] == "30m"
    assert raw["rules"]["idle_allocation"]["ladder"][3]["after"] == "1h" and "window" not in raw["rules"]["partly_idle"]


# -- candidates ---------------------------------------------------------------------------------------------
def test_a_small_space_is_a_grid_without_the_base_twice_and_lists_what_the_loader_refuses() -> None:
    s = space("rules.idle_allocation.util_max: [5, 18]\nrules.low_efficiency.util_mean_max: [20, 15]\n")
    tried, search, invalid = candidates(s, BASE_TEXT, str(BASE), max_candidates=48)
    assert search == "grid"
    # (5, 20) is the base; (18, 15) has low_efficiency's bar under idle_allocation's: the loader refuses it
    assert [c.overrides for c in tried] == [{}, {"rules.low_efficiency.util_mean_max": 15},
                                            {"rules.idle_allocation.util_max": 18}]
    assert len(invalid) == 1 and "util_mean_max" in str(invalid[0].error)
    assert all(c.policy is not None and c.policy.mode == "dry-run" for c in tried)  # the base's mode is kept


def test_a_large_space_is_searched_at_random_reproducibly() -> None:
    s = space("rules.idle_allocation.util_max: {min: 1, max: 10}\nrules.idle_allocation.window: {min: 15m, max: 4h}\n"
              "rules.zombie.window: [10m, 15m, 30m]\n")
    a, search, _ = candidates(s, BASE_TEXT, str(BASE), max_candidates=2, seed=7)
    b, _, _ = candidates(s, BASE_TEXT, str(BASE), max_candidates=2, seed=7)
    c, _, _ = candidates(s, BASE_TEXT, str(BASE), max_candidates=2, seed=8)
    assert search == "random" and len(a) == 3  # the base and two draws
    assert [x.overrides for x in a] == [x.overrides for x in b] != [x.overrides for x in c]


# -- the Pareto set and the choice ----------------------------------------------------------------------------
point = st.fixed_dictionaries({k: st.integers(0, 4) for k, _ in OBJECTIVES})


@settings(max_examples=200, deadline=None)
@given(st.lists(point, min_size=1, max_size=25))
def test_the_pareto_set_is_exactly_the_undominated(points: list[dict[str, int]]) -> None:
    front = set(pareto(points))
    for i, p in enumerate(points):
        beaten = any(dominates(q, p) for j, q in enumerate(points) if j != i)
        assert (i in front) == (not beaten)
    assert front  # a non-empty set always has an undominated point


def test_dominance_follows_each_objectives_direction() -> None:
    base = {"freed_gpu_hours": 10, "false_kills": 0, "notices_per_user_week": 2, "idle_left_gpu_hours": 50}
    assert dominates({**base, "freed_gpu_hours": 11}, base)
    assert dominates({**base, "idle_left_gpu_hours": 40}, base)
    assert not dominates({**base, "freed_gpu_hours": 11, "false_kills": 1}, base)
    assert not dominates(base, base)


def _cand(name: str, freed: float, kills: int = 0, notices: float = 1.0, idle: float = 10.0, n: int = 1) -> Candidate:
    c = Candidate(name, {} if name == "base" else {f"k{i}": i for i in range(n)}, {})
    c.figures = {"freed_gpu_hours": freed, "false_kills": kills, "notices_per_user_week": notices,
                 "idle_left_gpu_hours": idle}
    return c


def test_the_choice_frees_most_with_no_false_kill_and_no_more_notices_than_the_base() -> None:
    base = _cand("base", 10)
    chosen, why = choose([base, _cand("c01", 30, kills=1), _cand("c02", 25, notices=1.5), _cand("c03", 20),
                          _cand("c04", 20, n=3)])
    assert chosen is not None and chosen.name == "c03" and "c03 frees the most" in why
    none, why = choose([base, _cand("c01", 9), _cand("c02", 30, kills=2)])
    assert none is None and "no candidate beats the base" in why
    none, why = choose([_cand("base", 10, kills=1), _cand("c01", 30, kills=2)])
    assert none is None and "no candidate qualifies" in why


# -- the proposed policy file ---------------------------------------------------------------------------------
def _result(overrides: dict[str, object]) -> TuneResult:
    from gpu_cost.config.loader import parse_policy
    from gpu_cost.sim.tune import Space, _dump

    raw = with_overrides(yaml.safe_load(BASE_TEXT), overrides)
    base = _cand("base", 1)
    base.raw = yaml.safe_load(BASE_TEXT)
    cand = _cand("c01", 2)
    cand.overrides, cand.raw, cand.policy = dict(overrides), raw, parse_policy(_dump(raw), "c01")
    for c in (base, cand):
        c.figures.update(reclaimed_gpu_hours=1.0, kills=1, notices=2)
    return TuneResult(search="grid", seed=0, space=Space("space.yaml", ()), base_source=str(BASE), base_text=BASE_TEXT,
                      tried=[base, cand], invalid=[], pareto=["c01"], chosen=cand, reason="c01 frees the most")


def test_the_proposal_is_the_base_file_edited_in_place_with_figures_and_a_diff(tmp_path: Path) -> None:
    from gpu_cost.config.loader import load_policy

    res = _result({"rules.idle_allocation.window": "30m", "rules.idle_allocation.ladder[3].after": "2h"})
    out = write_policy(res, tmp_path / "proposed.yaml")
    text = out.read_text()
    assert text.startswith("# Proposed by `gpu-cost tune`") and "NOT IN USE" in text
    assert "#   rules.idle_allocation.window: 15m -> 30m" in text and "# +    window: 30m" in text
    assert "# GPU Cost Agent — default policy." in text  # the base's comments are kept
    loaded = load_policy(out)
    assert loaded.rules.idle_allocation.window == 1800 and loaded.rules.idle_allocation.ladder[3].after == 7200
    assert loaded == res.chosen.policy  # type: ignore[union-attr]


def test_a_key_the_base_leaves_out_rewrites_the_document_and_says_so() -> None:
    from gpu_cost.config.loader import parse_policy

    res = _result({"rules.partly_idle.window": "30m"})
    text = render_policy(res, res.chosen)  # type: ignore[arg-type]
    assert "comments are lost" in text
    assert parse_policy(text, "x").rules.partly_idle.window == 1800


def test_the_proposal_is_never_written_over_the_base_or_the_running_policy(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    res = _result({"rules.idle_allocation.window": "30m"})
    with pytest.raises(GpuCostError, match="never changes it"):
        write_policy(res, BASE)
    running = tmp_path / "running.yaml"
    running.write_text(BASE_TEXT)
    monkeypatch.setenv("GPU_COST_POLICY", str(running))
    with pytest.raises(GpuCostError, match="never changes it"):
        write_policy(res, running)
    assert running.read_text() == BASE_TEXT
    res.chosen = None
    with pytest.raises(GpuCostError, match="nothing written"):
        write_policy(res, tmp_path / "x.yaml")


# -- the command ----------------------------------------------------------------------------------------------
@pytest.mark.slow  # five replays of a day of 16 GPUs
def test_tune_command_on_a_generated_day(tmp_path: Path, day16: dict[str, str]) -> None:
    from gpu_cost.config.loader import load_policy

    trace = day16
    data = yaml.safe_load(BASE_TEXT)
    data["sweep"]["interval"] = "15m"  # a third of the sweeps: a short test
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(data))
    sp = tmp_path / "space.yaml"
    sp.write_text("rules.idle_allocation.window: [30m, 1h]\nrules.idle_allocation.ladder[3].after: [30m, 2h]\n")
    out = tmp_path / "proposed.yaml"
    r = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "tune", "--samples", trace["samples"], "--jobs",
                        trace["jobs_file"], "--policy", str(base), "--space", str(sp), "--write", str(out), "--json"],
                       capture_output=True, text=True, env=dict(os.environ), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    assert len(lines) == 1
    payload = json.loads(lines[0])
    assert {"candidates", "pareto", "chosen", "search", "seed"} <= set(payload)
    assert payload["search"] == "grid" and payload["seed"] == 0
    names = [c["name"] for c in payload["candidates"]]
    assert names == ["base", "c01", "c02", "c03", "c04"]
    for c in payload["candidates"]:
        assert {"freed_gpu_hours", "false_kills", "notices_per_user_week", "idle_left_gpu_hours"} <= set(c)
    assert payload["pareto"] and set(payload["pareto"]) <= set(names)
    assert payload["chosen"] is not None and payload["written"] == str(out)
    assert payload["chosen"]["false_kills"] == 0
    text = out.read_text()
    assert text.startswith("# Proposed by `gpu-cost tune` (grid search")
    proposed = load_policy(out)
    assert proposed.mode == "dry-run"  # the base's mode: the proposal acts no more than the base did
    chosen = payload["chosen"]["overrides"]
    if "rules.idle_allocation.window" in chosen:
        assert proposed.rules.idle_allocation.window == {"30m": 1800, "1h": 3600}[chosen["rules.idle_allocation.window"]]
    assert "\r[" not in r.stderr  # no progress bar without a terminal


# -- the prepared trace: read once, replayed many times -------------------------------------------------------
@pytest.fixture(scope="module")
def day16(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A generated day of 16 GPUs (``gpu-cost sim-trace --days 1 --gpus 16``): the default ladder kills twice in it."""
    from gpu_cost.cli.commands.simtrace import write_sim_trace

    return write_sim_trace(tmp_path_factory.mktemp("trace"), days=1, gpus=16, seed=0, end=1796040000.0)


def _fast_policy():  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import parse_policy

    data = yaml.safe_load(BASE_TEXT)
    data["sweep"]["interval"] = "15m"
    return parse_policy(yaml.safe_dump(data), "fast")


@pytest.mark.slow  # three replays of a day of 16 GPUs
def test_a_prepared_trace_replays_as_the_files_do_and_its_kills_never_leak(day16: dict[str, str]) -> None:
    from gpu_cost.sim.replay import prepare_files, replay_files

    policy = _fast_policy()
    direct = replay_files(day16["samples"], day16["jobs_file"], policy).to_dict()
    prepared = prepare_files(day16["samples"], day16["jobs_file"])
    util = prepared.matrices["util"].copy()  # type: ignore[index]
    first, second = prepared.replay(policy).to_dict(), prepared.replay(policy).to_dict()
    assert direct["kills"] > 0  # the kills edit the replay's matrices ...
    assert (prepared.matrices["util"] == util).all() or (  # type: ignore[index]
        (prepared.matrices["util"] != prepared.matrices["util"]) == (util != util)).all()  # type: ignore[index]
    for key in ("actions", "reclaimed_gpu_hours", "false_kills", "ledger", "idle_gpu_hours", "idle_left_gpu_hours"):
        assert first[key] == second[key] == direct[key], key  # ... never the prepared trace's
    assert direct["idle_left_gpu_hours"] < direct["idle_gpu_hours"]  # what the kills freed is idle no more


@pytest.mark.slow  # four replays of a day of 16 GPUs
def test_workers_share_the_prepared_trace_and_find_the_same(day16: dict[str, str]) -> None:
    from gpu_cost.config.loader import parse_policy
    from gpu_cost.sim.replay import prepare_files
    from gpu_cost.sim.tune import tune

    data = yaml.safe_load(BASE_TEXT)
    data["sweep"]["interval"] = "15m"
    base_text = yaml.safe_dump(data)
    parse_policy(base_text, "fast")
    s = parse_space("rules.idle_allocation.ladder[3].after: [1h, 10m]\n", "space.yaml", base_text, "fast")
    prepared = prepare_files(day16["samples"], day16["jobs_file"])
    seen: list[tuple[int, int]] = []
    one = tune(prepared, base_text, "fast", s, workers=1, progress=lambda d, t, _: seen.append((d, t)))
    two = tune(prepared, base_text, "fast", s, workers=2)
    strip = [{k: v for k, v in c.figures.items() if k != "seconds"} for c in one.tried]
    assert strip == [{k: v for k, v in c.figures.items() if k != "seconds"} for c in two.tried]
    assert one.pareto == two.pareto and seen == [(0, 2), (1, 2), (2, 2)]


# -- the audit store's usage rows as a trace -------------------------------------------------------------------
def _usage(ts: float, host: str, gpus: int, user: str = "", zombies: int = 0, alloc: int = 0) -> dict[str, object]:
    return {"ts": ts, "interval_s": 300.0, "host": host, "gpu_model": "a100", "user_name": user,
            "account": "acct" if user else "", "partition_name": "batch" if user else "", "gpus": gpus,
            "total_gpu_s": 300.0 * gpus, "allocated_gpu_s": 300.0 * alloc, "busy_gpu_s": 0.0, "idle_alloc_gpu_s": 0.0,
            "zombie_gpu_s": 300.0 * zombies, "util_sum": 0.0}


def _job(ts: float, job_id: str, gpus: int, active: int, work: float, stale: int = 0) -> dict[str, object]:
    return {"ts": ts, "job_id": job_id, "interval_s": 300.0, "user_name": "ann", "account": "acct",
            "partition_name": "batch", "gpu_model": "a100", "job_name": "train", "gpus": gpus, "gpus_requested": gpus,
            "gpus_busy": active, "gpus_active": active, "gpus_stale": stale, "work_gpus": work, "time_limit_s": 7200.0,
            "start_ts": 1000.0, "mem_max_mib": 30000.0, "mem_total_mib": 81920.0}


def test_usage_rows_become_a_trace_the_replay_reads() -> None:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.report.usage_trace import build_trace

    policy = load_policy(None)
    t = [1800.0 + 300.0 * k for k in range(4)]
    usage, jobs = [], []
    for k, ts in enumerate(t):
        usage += [_usage(ts, "n1", 2, user="ann", alloc=2), _usage(ts, "n1", 2, zombies=2 if k >= 1 else 0)]
        if k < 3:  # the job ends after the third sweep
            jobs.append(_job(ts, "7", 2, active=1 if k == 0 else 0, work=0.6 if k == 0 else 0.0, stale=1 if k == 2 else 0))
    tr = build_trace(usage, jobs, policy)
    s = tr.samples
    assert sorted(s["ts"].unique())[:2] == [1560.0, 1620.0] and s["ts"].max() == t[-1]  # 60 s samples over each interval
    assert set(zip(s["host"], s["gpu"], strict=True)) == {("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3)}
    first = s[s["ts"] == t[0]].set_index("gpu")
    assert first.loc[0, "util"] == 60.0 and first.loc[1, "util"] == 0.0 and first.loc[0, "job_id"] == "7"
    assert first.loc[0, "mem_used_mib"] == 30000.0 and first.loc[2, "pid"] == 0
    third = s[s["ts"] == t[2]]
    assert len(third[third["job_id"] == "7"]) == 1  # its stale GPU has no sample
    zombie = s[(s["ts"] >= t[1]) & (s["pid"] > 0)]
    assert set(zombie["gpu"]) == {2, 3} and zombie["pid"].nunique() == 1  # turned zombie together: one process
    assert (zombie["mem_used_mib"] > policy.rules.zombie.mem_min_mib).all() and (zombie["util"] == 0).all()
    last = s[s["ts"] == t[3]].set_index("gpu")
    assert set(last.index) == {0, 1, 2, 3} and last["job_id"].isna().all()  # the job's GPUs are free again
    job = tr.jobs.set_index("job_id").loc["7"]
    assert job["start_ts"] == 1000.0 and job["end_ts"] == t[2] and job["gpus"] == 2 and job["user"] == "ann"
    from gpu_cost.sim.replay import prepare

    times = s["ts"].nunique()
    assert prepare([tr.samples], tr.jobs).matrices["util"].shape == (4, times)  # type: ignore[index]
