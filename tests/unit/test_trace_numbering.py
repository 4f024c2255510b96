"""A trace whose exporter numbers a node's GPUs otherwise than the scheduler: found, and nothing judged there.

``gres.conf`` listing a node's devices in another order than NVML's, or a ``CUDA_DEVICE_ORDER`` that differs,
makes the exporter's GPU 0 the scheduler's GPU 7. Live, the node probe compares the numberings
(:func:`gpu_cost.perceive.gpu_map.check_node`); a trace has only their consequences: on such a node a GPU is in
use while no job holds it as the jobs file numbers it, and free while one does. Read as numbered, a job's GPUs
there are another's: a serving endpoint's idle-looking GPU is a free one, and it was killed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.cli.commands.simtrace import write_sim_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.core.model import KILL_ACTIONS
from gpu_cost.perceive.gpu_map import MIN_RENUMBER_GAIN, _best_assignment, trace_numbering
from gpu_cost.sim.replay import replay_files
from tests.fixtures.core import ROOT

END = 1795910400.0  # a Monday, 00:00 UTC
STEP = 60.0


def _node(rng: np.random.Generator, n: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One node's day as the scheduler numbers it: (computing, known, held), each n x steps.

    Jobs come and go on each GPU; a job's GPU computes while it holds it, give or take what real nodes show: the
    exporter sees a job's work a scrape or two after its start and after its end, some jobs sit idle for a tail
    of their allocation (an idle allocation) or wait between bursts (a service), and scrapes fail at random. (A
    zombie holds memory and computes nothing: it is no part of this.)"""
    held = np.zeros((n, steps), dtype=bool)
    use = np.zeros((n, steps), dtype=bool)
    for g in range(n):
        t = int(rng.integers(0, steps // 4))
        while t < steps:
            length = int(rng.integers(steps // 20, steps // 3))
            end = min(steps, t + length)
            held[g, t:end] = True
            lag = int(rng.integers(0, 3))
            work_end = end - (int(rng.integers(0, length // 5 + 1)) if rng.random() < 0.3 else 0)
            use[g, min(end, t + lag):min(steps, work_end + lag)] = True
            if rng.random() < 0.2:  # a service: it rests between bursts
                quiet = rng.random(steps) < 0.6
                use[g, t:end] &= ~quiet[t:end]
            t = end + int(rng.integers(1, steps // 6))
    known = rng.random((n, steps)) > 0.03
    return use, known, held


@pytest.mark.parametrize("seed", range(30))
def test_a_renumbered_node_is_found_and_no_other(seed: int) -> None:
    """Random fleets of 4 to 12 nodes of 4 or 8 GPUs; a random part of them renumbered by a random permutation. A
    node numbered as the scheduler numbers it is never taken as renumbered. A renumbered node is found whenever its
    true numbering explains a fifth of its GPU-time more than the scheduler's, and the numbering found explains
    at least as much as the true one."""
    rng = np.random.default_rng(seed)
    steps = 1440
    hosts: list[str] = []
    gpus: list[int] = []
    uses, knowns, helds = [], [], []
    renumbered: dict[str, np.ndarray] = {}
    for k in range(int(rng.integers(4, 13))):
        n = int(rng.choice([4, 8]))
        use, known, held = _node(rng, n, steps)
        host = f"n{k:02d}"
        if rng.random() < 0.5:
            perm = rng.permutation(n)
            if (perm != np.arange(n)).any():
                # the samples' GPU e shows the scheduler's GPU perm[e]
                use, known = use[perm], known[perm]
                renumbered[host] = perm
        hosts += [host] * n
        gpus += list(range(n))
        uses.append(use)
        knowns.append(known)
        helds.append(held)
    in_use, known, held = np.vstack(uses), np.vstack(knowns), np.vstack(helds)
    found = trace_numbering(hosts, gpus, in_use, known, held, STEP)
    assert set(found) <= set(renumbered), f"taken as renumbered while numbered as the scheduler: {set(found) - set(renumbered)}"
    rows = np.array(hosts)
    for host, perm in renumbered.items():
        at = np.flatnonzero(rows == host)
        u, k, h = in_use[at] & known[at], known[at], held[at]
        agree = u.astype(float) @ h.T.astype(float) + ((~in_use[at]) & k).astype(float) @ (~h).T.astype(float)
        true_gain = (agree[np.arange(len(at)), perm].sum() - np.trace(agree)) / k.sum()
        if true_gain >= 2 * MIN_RENUMBER_GAIN:
            assert host in found, (host, true_gain)
        if host in found:
            mapping = [found[host].get(e, e) for e in range(len(at))]
            assert agree[np.arange(len(at)), mapping].sum() >= agree[np.arange(len(at)), perm].sum() - 1e-6


def test_the_best_numbering_is_the_best() -> None:
    """The assignment is exact: every permutation of small random scores checked."""
    import itertools

    rng = np.random.default_rng(0)
    for n in range(1, 7):
        for _ in range(30):
            score = rng.integers(0, 10, (n, n)).astype(float)
            got = _best_assignment(score)
            best = max(sum(score[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
            assert sorted(got) == list(range(n)) and sum(score[i, got[i]] for i in range(n)) == best


def test_a_short_trace_proves_nothing() -> None:
    """Two GPUs swapped, seen for ten minutes: under an hour of GPU-time explained otherwise, nothing is said."""
    held = np.array([[True] * 10, [False] * 10])
    in_use = held[::-1].copy()
    assert trace_numbering(["n"] * 2, [0, 1], in_use, np.ones_like(held), held, STEP) == {}
    assert trace_numbering(["n"] * 2, [0, 1], in_use, np.ones_like(held), held, 3600.0) == {"n": {0: 1, 1: 0}}


def test_a_zombie_beside_an_idle_allocation_started_with_it_is_no_renumbering() -> None:
    """One user's two jobs start together: the first ends in 20 minutes and leaves its process holding memory (a
    zombie); the second computes for 10 minutes and then holds its GPU idle for a day (an idle allocation).
    Swapping the two GPUs explains their memory better than their numbers do, which is why memory held does not
    testify: the waste is what the agent is there to find, read by the numbering it is."""
    from gpu_cost.perceive.gpu_map import trace_claims

    steps = 1440
    times = np.arange(steps) * STEP
    util = np.zeros((2, steps))
    util[0, :20] = util[1, :10] = 90.0
    mem = np.zeros((2, steps))
    mem[0, :] = mem[1, :10] = 30000.0  # the zombie's memory stays after its job's end
    claims = [([0], 0.0, 20 * STEP), ([1], 0.0, float(steps) * STEP)]
    assert trace_claims(["n", "n"], [0, 1], times, util, np.zeros(2, dtype=bool), claims, 20.0, STEP) == {}
    # their work alone, renumbered, is explained as well either way (both computed from the start): nothing said
    assert trace_claims(["n", "n"], [0, 1], times, util[::-1], np.zeros(2, dtype=bool), claims, 20.0, STEP) == {}
    busy = np.zeros((2, steps))
    busy[0, :] = 90.0  # a day of training on the GPU the jobs file gives the idle job, as the samples number it
    claims = [([1], 0.0, float(steps) * STEP)]
    assert trace_claims(["n", "n"], [0, 1], times, busy, np.zeros(2, dtype=bool), claims, 20.0, STEP) == {"n": {0: 1, 1: 0}}
    # ... unless the samples label the node's GPUs with jobs: the exporter's own word
    assert trace_claims(["n", "n"], [0, 1], times, busy, np.array([True, False]), claims, 20.0, STEP) == {}


@pytest.fixture(scope="module")
def hard_day(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """A generated day of the hard mix (services among training, idle and finished jobs), 32 GPUs at 30 s, with no
    job label in the samples: only the jobs file's gpu_ids place the jobs."""
    out = tmp_path_factory.mktemp("numbering")
    write_sim_trace(out, days=1.0, gpus=32, seed=3, end=END, sample_interval=30.0, behaviours="hard")
    s = pd.read_parquet(out / "samples.parquet")
    s.drop(columns=[c for c in ("job_id", "pid", "user") if c in s.columns]).to_parquet(out / "unlabelled.parquet")
    return out


def _kills(res: dict) -> list[str]:
    return [a["target"] for a in res["actions"] if a["action"] in KILL_ACTIONS]


@pytest.mark.parametrize("how", ["rotated", "reversed"])
def test_a_trace_numbered_otherwise_kills_nothing_there(hard_day: Path, how: str) -> None:
    """The hard day with every node's GPUs renumbered (the samples' GPU g is the jobs' GPU g - 1, or 7 - g). Read as
    numbered, endpoints' GPUs read as other GPUs, and the replay killed them (rotated: 4 kills, 1 false; reversed: 7,
    3 false). Now the nodes whose work shows it are found renumbered, said in the notes, and nothing there is
    judged: no false kill."""
    policy = load_policy(ROOT / "include" / "policy" / "default.yaml")
    s = pd.read_parquet(hard_day / "unlabelled.parquet")
    s["gpu"] = (s["gpu"] + 1) % 8 if how == "rotated" else 7 - s["gpu"]
    s.to_parquet(path := hard_day / f"{how}.parquet")
    res = replay_files(path, hard_day / "jobs.csv", policy).to_dict()
    assert res["false_kills"] == 0
    note = [n for n in res["notes"] if "number their GPUs otherwise" in n]
    assert note, res["notes"]
    # the fleet's figures are the whole trace's: a renumbering moves no GPU-hour sampled or held (which GPU is idle
    # while held moves where the samples cannot show the renumbering)
    base = replay_files(hard_day / "unlabelled.parquet", hard_day / "jobs.csv", policy).to_dict()
    kept = ("gpus", "gpu_hours", "allocated_gpu_hours")
    assert [res[k] for k in kept] == [base[k] for k in kept] and base["allocated_gpu_hours"] > 0
    assert not [n for n in base["notes"] if "number their GPUs otherwise" in n] and _kills(base)


def _longer_windows():  # type: ignore[no-untyped-def]
    """The default policy with the idle-allocation rule judging over an hour, not the zombie rule's 15 minutes (as an
    operator or ``gpu-cost tune`` sets it): it then reads a window of its own, not the snapshot's primary one."""
    import yaml

    from gpu_cost.config.loader import parse_policy

    path = ROOT / "include" / "policy" / "default.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["rules"]["idle_allocation"]["window"] = "1h"
    return parse_policy(yaml.safe_dump(raw), str(path))


@pytest.mark.parametrize("window", ["default", "1h"])
def test_one_renumbered_node_leaves_the_others_judged(hard_day: Path, window: str) -> None:
    """One node renumbered: only it is left alone; the others' kills are the whole trace's there. So with the
    idle-allocation rule judging over an hour (:func:`_longer_windows`), a window of its own: it killed two jobs on
    that node when only the primary window said the node's GPUs were stale."""
    policy = load_policy(ROOT / "include" / "policy" / "default.yaml") if window == "default" else _longer_windows()
    s = pd.read_parquet(hard_day / "unlabelled.parquet")
    host = sorted(s["host"].unique())[2]
    s.loc[s["host"] == host, "gpu"] = 7 - s.loc[s["host"] == host, "gpu"]
    s.to_parquet(path := hard_day / f"one-{window}.parquet")
    res = replay_files(path, hard_day / "jobs.csv", policy).to_dict()
    base = replay_files(hard_day / "unlabelled.parquet", hard_day / "jobs.csv", policy).to_dict()
    assert res["false_kills"] == 0
    note = [n for n in res["notes"] if "number their GPUs otherwise" in n]
    assert note and note[0].startswith(f"1 node(s) number their GPUs otherwise than the jobs file's gpu_ids ({host}:")
    jobs = pd.read_csv(hard_day / "jobs.csv", dtype={"job_id": str})
    on = {f"job:{j}" for j, n in zip(jobs["job_id"], jobs["nodes"].astype(str), strict=True) if n == host}
    assert not {t for t in _kills(res)} & on
    assert {t for t in _kills(res)} == {t for t in _kills(base) if t not in on}
    # the figures read the jobs' GPUs there where the renumbering found puts them: those of the trace as numbered
    assert [res[k] for k in ("allocated_gpu_hours", "idle_gpu_hours")] == [base[k] for k in ("allocated_gpu_hours",
                                                                                             "idle_gpu_hours")]


def test_a_sweep_of_a_renumbered_trace_is_degraded_as_a_live_one_is(hard_day: Path) -> None:
    """``gpu-cost sweep --source trace`` reads a trace at one instant. A node whose numbering disagrees gets what a
    live sweep gives one whose node probe disagrees (:func:`gpu_cost.perceive.gpu_map.apply`): its GPUs stale, a
    problem naming it, so nothing destructive is decided. The trace as numbered has no such problem."""
    from gpu_cost.perceive import trace

    policy = load_policy(ROOT / "include" / "policy" / "default.yaml")
    s = pd.read_parquet(hard_day / "unlabelled.parquet")
    now = float(s["ts"].max())
    host = sorted(s["host"].unique())[1]
    plain = trace.snapshot(policy, now, s, hard_day / "jobs.csv")
    assert not [p for p in plain.problems if "gpu index check" in p] and not plain.gpus["stale"].all()
    s.loc[s["host"] == host, "gpu"] = 7 - s.loc[s["host"] == host, "gpu"]
    snap = trace.snapshot(policy, now, s, hard_day / "jobs.csv")
    said = [p for p in snap.problems if p.startswith("gpu index check: 1 node(s)")]
    assert said and f"({host}:" in said[0] and snap.degraded
    stale = snap.gpus.groupby("host")["stale"].all()
    assert stale[host] and stale.drop(host).eq(plain.gpus.groupby("host")["stale"].all().drop(host)).all()


def test_an_exporter_numbering_from_one_is_said_and_kills_nothing(hard_day: Path) -> None:
    """The samples number each node's GPUs 1 to 8 where Slurm numbers them 0 to 7. The jobs' GPU 0 is then no
    sampled GPU, and every other one is its neighbour's: the notes say which GPUs no sample shows, the nodes whose
    work shows it are in doubt, and nothing is killed falsely."""
    policy = load_policy(ROOT / "include" / "policy" / "default.yaml")
    s = pd.read_parquet(hard_day / "unlabelled.parquet")
    s["gpu"] = s["gpu"] + 1
    s.to_parquet(path := hard_day / "from-one.parquet")
    res = replay_files(path, hard_day / "jobs.csv", policy).to_dict()
    assert res["false_kills"] == 0
    said = [n for n in res["notes"] if "that no sample shows" in n]
    assert said and ": 0; its samples number 1, 2, 3, 4, 5, 6, 7, 8)" in said[0], res["notes"]
    base = replay_files(hard_day / "unlabelled.parquet", hard_day / "jobs.csv", policy).to_dict()
    assert not [n for n in base["notes"] if "that no sample shows" in n]


def test_a_renumbered_node_is_stale_in_every_window_the_rules_read(hard_day: Path) -> None:
    """A node whose numbering is in doubt is stale in the primary window and in each other window a rule reads: a
    rule with a longer window (the idle-interactive rule's two hours, an idle-allocation window tuned to an hour)
    would otherwise judge its GPUs by samples that belong to other GPUs."""
    from gpu_cost.perceive import trace
    from gpu_cost.perceive.snapshot import rule_windows

    policy = _longer_windows()
    s = pd.read_parquet(hard_day / "unlabelled.parquet")
    now = float(s["ts"].max())
    host = sorted(s["host"].unique())[1]
    s.loc[s["host"] == host, "gpu"] = 7 - s.loc[s["host"] == host, "gpu"]
    snap = trace.snapshot(policy, now, s, hard_day / "jobs.csv")
    primary, others = rule_windows(policy)
    assert 3600.0 in others and 7200.0 in others
    there = (snap.gpus["host"] == host).to_numpy()
    for w in [primary, *others]:
        stale = snap.columns(w).get("stale", bool)
        assert stale[there].all(), w
        assert snap.view(w)["stale"].to_numpy(dtype=bool)[there].all(), w
        # the other nodes keep their own window's word
        assert not stale[~there].all(), w
