"""Replica sets: copies of one service recognised by owner, name stem and resident memory; an idle
replica of a serving set gets advice to scale the set, never a kill of the one replica."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from gpu_cost.analyse import replicas
from gpu_cost.analyse.rules import run_rules
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Job, Node, Snapshot
from gpu_cost.decide.engine import decide
from gpu_cost.perceive.snapshot import from_matrix
from tests.fixtures.core import NOW
from tests.unit.policy.helpers import policy_from

H = 3600.0
STEP = 60.0
TIMES = np.arange(NOW - Policy().sweep.lookback + STEP, NOW + 1, STEP)
MODEL = 17000.0  # MiB resident: the same model on every replica
ENFORCE = policy_from("mode: enforce\n")
QUIET = np.full(len(TIMES), 0.3)


def trickle(every: int = 7, offset: int = 0) -> np.ndarray:
    """A replica serving a trickle: a one-minute request at 30 % every ``every`` minutes, 0.3 % between."""
    return np.where((np.arange(len(TIMES)) + offset) % every == 0, 30.0, 0.3)


def pod(i: int, name: str, *, user: str = "llmops", start: float = NOW - 20 * H) -> Job:
    host = f"s{i}"
    return Job(job_id=str(100 + i), user=user, account="llm-platform", partition="batch", name=name,
               start_ts=start, gpu_alloc=((host, (0,)),), nodes=(host,), batch=True, time_limit_s=30 * 86400.0)


def fleet(specs: list[tuple[Job, np.ndarray, float]], policy: Policy = ENFORCE) -> Snapshot:
    """One 1-GPU node per job, each with its own utilisation over the lookback and constant memory."""
    n = len(specs)
    hosts = np.array([j.nodes[0] for j, _, _ in specs], dtype=object)
    util = np.vstack([u for _, u, _ in specs])
    mem = np.vstack([np.full(len(TIMES), m) for _, _, m in specs])
    return from_matrix(
        policy=policy, now=NOW, source="test", hosts=hosts, gpus=np.zeros(n, dtype=np.int64),
        uuids=np.array([f"GPU-{i}" for i in range(n)], dtype=object), models=np.array(["h100"] * n, dtype=object),
        mem_total=np.full(n, 81920.0), times=TIMES, util=util, mem=mem, power=np.full(util.shape, 60.0),
        job=np.full(util.shape, "", dtype=object), jobs=tuple(j for j, _, _ in specs), processes=(),
        nodes=tuple(Node(h, state="mixed", gpus_total=1, gpus_alloc=1) for h in hosts),
    )


def serving_set(starved: int = 1, serving: int = 3, **kw: Any) -> list[tuple[Job, np.ndarray, float]]:
    """``starved`` replicas that got no request for the whole lookback beside ``serving`` that serve a trickle."""
    names = ["chat-api-5d8f7c9b4-x2k4p", "chat-api-5d8f7c9b4-bqzlp", "chat-api-7", "chat-api-7f9c2",
             "chat-api-5d8f7c9b4-rtwvh", "chat-api-12"]
    out = [(pod(i, names[i], **kw), QUIET, MODEL) for i in range(starved)]
    out += [(pod(starved + i, names[starved + i], **kw), trickle(offset=i), MODEL + 20 * i) for i in range(serving)]
    return out


def idle_findings(snap: Snapshot, policy: Policy = ENFORCE) -> dict[str, Any]:
    return {f.job_id: f for f in run_rules(snap, policy) if f.rule == "idle_allocation"}


@pytest.mark.parametrize(("name", "stem"), [
    ("llm-serve-3", "llm-serve"), ("llm-serve-7f9c2", "llm-serve"), ("chat-api-5d8f7c9b4-x2k4p", "chat-api"),
    ("chat-api-5d8f7c9b4-bqzlp", "chat-api"), ("qwen2-chat", "qwen2-chat"), ("llama7b-endpoint-3f9a2c", "llama7b-endpoint"),
    ("7", "7"), ("rnn-lstm", "rnn-lstm"), ("Chat_API.4", "chat_api"),
], ids=["index", "hash", "k8s", "k8s-no-digit", "digit-in-word", "words-with-digits", "only-an-index", "short-words",
        "case-and-separators"])
def test_the_replica_stem_strips_indices_and_hashes_only(name: str, stem: str) -> None:
    assert replicas.replica_stem(name) == stem


def test_a_serving_set_is_found_and_described() -> None:
    snap = fleet(serving_set(starved=1, serving=3))
    sets = replicas.replica_sets(snap, ENFORCE)
    assert set(sets) == {"100", "101", "102", "103"}
    s = sets["100"]
    assert (s.owner, s.stem, s.size) == ("llmops", "chat-api", 4)
    assert s.members == ("100", "101", "102", "103") and s.serving == ("101", "102", "103")
    assert 1 <= s.peak_busy <= 3 and s.needed == max(1, -(-s.peak_busy * 125 // 100))
    assert replicas.spare(snap, ENFORCE, "100") is s
    ev = s.evidence()
    assert ev["size"] == 4 and ev["busy_at_peak"] == s.peak_busy and ev["members"] == list(s.members)
    assert "scale" in ev["advice"] or "not oversized" in ev["advice"]


def set_apart(specs: list[tuple[Job, np.ndarray, float]], split: str | None) -> list[tuple[Job, np.ndarray, float]]:
    """The set with its first member made another owner's, another stem's, or holding another memory."""
    job, util, mem = specs[0]
    if split == "owner":
        job = dataclasses.replace(job, user="ann")
    elif split == "stem":
        job = dataclasses.replace(job, name="rerank-api-5d8f7c9b4-x2k4p")
    elif split == "footprint":
        mem = MODEL * 1.2  # another model: outside mem_tolerance (5 %)
    elif split == "empty":
        mem = 600.0  # a CUDA context, no model
    elif split == "one measured":
        mem = MODEL
    return [(job, util, mem), *specs[1:]]


@pytest.mark.parametrize("split", ["owner", "stem", "footprint", "empty"])
def test_what_is_not_a_replica(split: str) -> None:
    snap = fleet(set_apart(serving_set(starved=1, serving=2), split))
    assert "100" not in replicas.replica_sets(snap, ENFORCE)
    assert replicas.spare(snap, ENFORCE, "100") is None
    f = idle_findings(snap)["100"]
    assert f.action == "cancel" and "replica_set" not in f.evidence  # judged alone


def test_the_memory_tolerance_is_a_policy_setting() -> None:
    specs = serving_set(starved=1, serving=2)
    job, util, _ = specs[0]
    snap_specs = [(job, util, MODEL * 1.08), *specs[1:]]
    assert "100" not in replicas.replica_sets(fleet(snap_specs), ENFORCE)
    loose = policy_from("mode: enforce\nreplicas: {mem_tolerance: 0.1}\n")
    assert "100" in replicas.replica_sets(fleet(snap_specs, loose), loose)
    off = policy_from("mode: enforce\nreplicas: {enabled: false}\n")
    assert replicas.replica_sets(fleet(specs, off), off) == {}


def test_a_set_where_no_other_member_serves_is_no_spare_capacity() -> None:
    specs = serving_set(starved=3, serving=0)
    snap = fleet(specs)
    assert replicas.replica_sets(snap, ENFORCE)["100"].serving == ()
    assert replicas.spare(snap, ENFORCE, "100") is None


def test_an_idle_replica_of_a_serving_set_is_advised_never_killed() -> None:
    # no inference: pattern names "chat-api", no protection names it, no class baseline: the set decides
    snap = fleet(serving_set(starved=2, serving=3))
    f = idle_findings(snap)["100"]
    assert f.action == "advise" and f.inference
    rs = f.evidence["replica_set"]
    assert rs["size"] == 5 and rs["busy_now"] >= 0 and rs["busy_at_peak"] >= 1 and rs["stem"] == "chat-api"
    assert any(s["what"] == "Replica set" for s in f.evidence["signals"])
    # the engine's ladder for it is one advice rung, however long it stays idle
    plan = decide([f], ENFORCE, now=NOW, escalations={})
    assert [d.action for d in plan.decisions] == ["advise"]
    row = {"state": "open", "episode": 1, "rung": 0, "first_seen": NOW - 10 * H, "last_action_at": NOW - 10 * H}
    later = decide([f], ENFORCE, now=NOW, escalations={(f.rule, f.target, "live"): row})
    assert later.decisions == [] and later.waiting[0]["why"] == "ladder complete"


def test_a_replica_whose_own_log_says_it_finished_is_judged_alone() -> None:
    snap = fleet(serving_set(starved=1, serving=2))
    snap.job_logs = {"100": {"text": "epoch 3\nTraining finished after 3 epochs\n", "mtime": NOW - 2 * H, "size": 40}}
    f = idle_findings(snap)["100"]
    assert f.action == "cancel" and "replica_set" not in f.evidence


def _peak_by_hand(snap: Snapshot, members: tuple[str, ...], busy_now: int) -> int | None:
    """The most members busy in one bucket, member by member from the chart texts (one GPU each here)."""
    thr = ENFORCE.rules.idle_allocation.util_max
    charts = dict(zip(snap.gpus["job_id"], snap.gpus["util_chart_lb"], strict=True))
    busy = [[x != "" and float(x) >= thr for x in charts[m].split(",")] for m in members if charts[m]]
    if not busy or len({len(b) for b in busy}) != 1:
        return None
    return max(max(sum(col) for col in zip(*busy, strict=True)), busy_now)


@pytest.mark.parametrize("chart", ["same", "empty", "shorter"])
def test_the_peak_counts_the_members_whose_charts_say_when_they_were_busy(chart: str) -> None:
    snap = fleet(serving_set(starved=2, serving=4))
    if chart != "same":  # one serving member's chart: none at all (it does not count), or fewer buckets (no peak)
        row = snap.gpus["job_id"] == "103"
        text = snap.gpus.loc[row, "util_chart_lb"].iloc[0]
        snap.gpus.loc[row, "util_chart_lb"] = "" if chart == "empty" else text.rsplit(",", 1)[0]
    s = replicas.replica_sets(snap, ENFORCE)["100"]
    assert s.peak_busy == _peak_by_hand(snap, s.members, len(s.busy_now))
    assert (s.peak_busy is None) == (chart == "shorter")
    if chart == "shorter":
        assert s.needed is None and "served in the lookback" in s.advice()
    else:
        assert s.peak_busy >= 1 and s.needed == max(1, -(-s.peak_busy * 125 // 100))


def _peak_of_members(members: list[list[str]], thr: float) -> int | None:
    """A set's peak member by member, GPU by GPU (what the peak means, written plainly): a member counts with the
    buckets one of its GPUs was busy in when its GPUs' charts have one non-zero length; the counted members must
    agree on it."""
    busy_in = []
    for gpus in members:
        rows = [[float(x) if x else None for x in text.split(",")] if text else [] for text in gpus]
        if not rows or len({len(r) for r in rows}) != 1 or not rows[0]:
            continue
        busy_in.append([any(v is not None and v >= thr for v in col) for col in zip(*rows, strict=True)])
    if not busy_in or len({len(b) for b in busy_in}) != 1:
        return None
    return max(sum(col) for col in zip(*busy_in, strict=True))


@pytest.mark.parametrize("seed", range(40))
def test_every_sets_peak_at_once_equals_the_peak_member_by_member(seed: int) -> None:
    import pandas as pd

    from gpu_cost.analyse.jobrows import JobRows

    rng = np.random.default_rng(seed)
    thr = float(rng.choice([1.0, 5.0, 30.0]))

    def chart() -> str:
        if rng.random() < 0.08:
            return ""  # no chart at all
        n = 12 if rng.random() < 0.85 else int(rng.integers(1, 14))  # mostly the usual 12 buckets
        return ",".join("" if rng.random() < 0.15 else str(int(rng.choice([0, 1, 4, 5, 29, 30, 80]))) for _ in range(n))

    jobs, texts, sets = [], [], []
    for s in range(int(rng.integers(1, 12))):
        members = [f"{s}-{m}" for m in range(int(rng.integers(2, 7)))]
        for m in members:
            for _ in range(int(rng.integers(1, 4))):  # 1 to 3 GPUs a member
                jobs.append(m)
                texts.append(chart())
        sets.append(tuple(members))
    order = rng.permutation(len(jobs))  # the frame's rows in any order, as a real frame's are
    frame = pd.DataFrame({"job_id": np.array(jobs, dtype=object)[order]})
    charts = np.array(texts, dtype=object)[order]
    got = replicas._peaks(sets, JobRows(frame), charts, thr)
    by_hand = [_peak_of_members([[c for j, c in zip(frame["job_id"], charts, strict=True) if j == m] for m in s], thr)
               for s in sets]
    assert got == by_hand


@pytest.mark.parametrize("split", [None, "owner", "stem", "one measured"])
def test_a_replica_set_without_memory_measured_is_told_by_owner_stem_and_shape(split: str | None) -> None:
    """A trace of utilisation alone (no framebuffer metric): nothing says whether the model is resident, so memory
    not measured counts as memory held, and replicas are the same owner's same stem with the same GPUs. A starved
    replica of a serving set is then advised, not cancelled (a real serving fleet, starved overnight, had 3 of 3
    such kills false). A job of another owner or stem is still judged alone; so are members whose memory is
    measured, among the unmeasured, when too few."""
    snap = fleet(set_apart([(j, u, np.nan) for j, u, _ in serving_set(starved=1, serving=2)], split))
    f = idle_findings(snap)["100"]
    if split is None:
        s = replicas.spare(snap, ENFORCE, "100")
        assert s is not None and s.members == ("100", "101", "102") and s.footprint_mib is None
        assert f.inference and f.action == "advise" and "memory not measured" in s.describe()
        assert s.evidence()["footprint_mib"] is None
    else:
        assert replicas.spare(snap, ENFORCE, "100") is None
        assert f.action == "cancel" and "replica_set" not in f.evidence
