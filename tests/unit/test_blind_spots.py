"""What a sweep cannot judge is said in the run's warnings, without degrading it: a GPU a running job holds that no
series shows (on a host whose other GPUs report), and the GPUs the sources disagree on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpu_cost.config.loader import load_policy
from gpu_cost.core.model import Disagreement, Job, Snapshot
from gpu_cost.loop import sweep
from gpu_cost.perceive.snapshot import disagreement_warning, from_matrix, unseen_gpu_warning

NOW = 1_795_910_400.0


@pytest.fixture(scope="module")
def snap() -> Snapshot:
    return sweep.collect(load_policy(), NOW, "sim")


def _held(snap: Snapshot) -> dict[tuple[str, int], str]:
    return {k: j.job_id for j in snap.running_jobs() for k in j.gpu_keys()}


@pytest.mark.parametrize("seed", range(10))
def test_each_held_gpu_no_series_shows_is_counted_and_the_run_stays_whole(snap: Snapshot, seed: int) -> None:
    """Random GPU rows dropped (an exporter that stopped showing them): the warning counts exactly the dropped GPUs
    that running jobs hold on hosts with a row left, names the first, and degrades nothing; a host with no row left
    is not this warning's (no series for a node degrades the run elsewhere)."""
    held = _held(snap)
    assert held and unseen_gpu_warning(snap) == []
    rng = np.random.default_rng(seed)
    g = snap.gpus
    drop = rng.random(len(g)) < rng.uniform(0.02, 0.3)
    if seed % 3 == 0:  # a whole host gone too
        drop |= (g["host"] == rng.choice(sorted(set(g["host"])))).to_numpy()
    kept = g[~drop].reset_index(drop=True)
    left = set(kept["host"].astype(str))
    gone = sorted((str(h), int(i)) for h, i in zip(g["host"][drop], g["gpu"][drop], strict=True)
                  if (str(h), int(i)) in held and str(h) in left)
    blind = dataclasses.replace(snap, gpus=kept)
    said = unseen_gpu_warning(blind)
    if not gone:
        assert said == []
        return
    (text,) = said
    h, i = gone[0]
    assert text.startswith(f"{len(gone)} GPU(s) that running jobs hold show no series on hosts whose other GPUs "
                           f"report ({h}:{i} (job {held[(h, i)]})")
    assert "judged by no rule" in text and "Xid 79" in text
    assert text in sweep.run_warnings(blind, {"warnings": []}) and not blind.degraded


def test_the_gpus_the_sources_disagree_on_are_named_in_the_run() -> None:
    """g1:1 labelled with running job 8, to which Slurm allocates no GPU there: the snapshot lists the disagreement, and
    the run's warnings now name it (it was kept in the parked snapshot alone, where no operator reads). Many are
    counted, the first two named."""
    policy = load_policy()
    times = NOW - 60.0 * np.arange(60)[::-1]
    util = np.full((2, len(times)), 50.0)
    jobs = [Job(job_id="7", user="ann", state="RUNNING", start_ts=NOW - 7200, nodes=("g1",), gpu_alloc=(("g1", (0,)),)),
            Job(job_id="8", user="bob", state="RUNNING", start_ts=NOW - 7200, nodes=("g2",), gpu_alloc=(("g2", (0,)),))]
    s = from_matrix(policy=policy, now=NOW, source="test", hosts=np.array(["g1", "g1"], dtype=object),
                    gpus=np.arange(2), uuids=np.array(["GPU-0", "GPU-1"], dtype=object),
                    models=np.array(["a100"] * 2, dtype=object), mem_total=np.full(2, 81920.0), times=times, util=util,
                    mem=np.full_like(util, 9000.0), power=None, job=np.array([[""], ["8"]], dtype=object), jobs=jobs,
                    processes=(), nodes=())
    (text,) = disagreement_warning(s)
    assert text == ("the scheduler, the exporter's labels and the GPU processes disagree on 1 GPU(s) (g1:1: label "
                    "names running job 8 but Slurm allocates the GPU to none)")
    assert text in sweep.run_warnings(s, {"warnings": []})
    more = dataclasses.replace(s, disagreements=(*s.disagreements, *(Disagreement("g2", i, "x") for i in range(3))))
    (text,) = disagreement_warning(more)
    assert "disagree on 4 GPU(s) (g1:1: label names" in text and text.endswith("; g2:0: x; and 2 more)")
    assert disagreement_warning(dataclasses.replace(s, disagreements=())) == []
