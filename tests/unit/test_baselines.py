"""Class baselines learnt over simulated days of sweeps: stems, idempotent updates, wakes, kinds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import pytest

from gpu_cost.analyse import baselines
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Job, Node, Snapshot
from gpu_cost.perceive.snapshot import from_matrix
from tests.fixtures.core import NOW

STEP = 1800.0  # one sweep every 30 minutes keeps days of sweeps fast
_BASE = Policy()
POLICY = dataclasses.replace(
    _BASE, sweep=dataclasses.replace(_BASE.sweep, interval=STEP, sample_interval=300.0, lookback=3 * 3600.0))
T0 = NOW - 3 * 86400.0  # sweep k is at T0 + k * STEP
H = 3600.0
DAYS = range(1, 65)  # 32 hours of sweeps
RESIDENT, EMPTY = 20000.0, 0.0

#: (job, is the job busy during sweep slot k (None: no data), memory held in MiB)
Spec = tuple[Job, Callable[[int], bool | None], float]


def at(k: float) -> float:
    return T0 + k * STEP


def snap_at(k: float, specs: Sequence[Spec], policy: Policy = POLICY) -> Snapshot:
    """The snapshot of sweep ``k``: one 1-GPU node per job; samples in slot ``k`` (the 30 minutes
    before the sweep) are busy (80 %), idle (0.2 %) or missing (None) as the spec says; only the
    lookback is built."""
    now = at(k)
    si = policy.sweep.sample_interval
    times = np.arange(now - policy.sweep.lookback + si, now + 1, si)
    slots = np.ceil((times - T0) / STEP).astype(int)
    n = len(specs)
    level = {True: 80.0, False: 0.2, None: np.nan}  # None: no sample (the exporter was down)
    util = np.array([[level[busy(int(s))] for s in slots] for _, busy, _ in specs])
    mem = np.array([[np.nan if busy(int(s)) is None else m for s in slots] for _, busy, m in specs])
    hosts = [f"g{i}" for i in range(n)]
    jobs = tuple(dataclasses.replace(j, gpu_alloc=((h, (0,)),), nodes=(h,)) for (j, _, _), h in zip(specs, hosts, strict=True))
    return from_matrix(
        policy=policy, now=now, source="test", hosts=np.array(hosts, dtype=object), gpus=np.zeros(n, dtype=np.int64),
        uuids=np.array([f"GPU-{i}" for i in range(n)], dtype=object), models=np.array(["a100"] * n, dtype=object),
        mem_total=np.full(n, 81920.0), times=times, util=util, mem=mem, power=np.full(util.shape, 60.0),
        job=np.full(util.shape, "", dtype=object), jobs=jobs, processes=(),
        nodes=tuple(Node(h, state="mixed", gpus_total=1, gpus_alloc=1) for h in hosts),
    )


def play(store: AuditStore, specs: Sequence[Spec], sweeps: range, policy: Policy = POLICY) -> dict[str, dict]:
    classes: dict[str, dict] = {}
    for k in sweeps:
        classes = baselines.observe(store, snap_at(k, specs, policy), policy, run_id=f"run-{k}")
    return classes


def rows(store: AuditStore, *job_ids: str) -> dict[str, dict]:
    return {r["job_id"]: r for r in store.fetch("class_members_of_jobs", {"job_ids": list(job_ids)})}


def counts(row: dict) -> tuple:
    return tuple(row[k] for k in ("seen_s", "active_s", "idle_s", "idle_mem_s", "wakes", "quiet_since",
                                  "longest_quiet_s", "data_ts", "last_seen"))


def job(job_id: str, name: str, *, user: str = "ann", account: str = "inf", partition: str = "gpu",
        start: float = T0 - 86400.0) -> Job:
    return Job(job_id=job_id, user=user, account=account, partition=partition, name=name, start_ts=start, batch=True)


def every(period: int, offset: int = 0, length: int = 1) -> Callable[[int], bool]:
    """Busy for ``length`` sweep slots every ``period`` slots: a service waking from quiet spells."""
    return lambda k: (k + offset) % period < length


def always_but(period: int) -> Callable[[int], bool]:
    """Busy except for one slot (30 minutes) every ``period``: training with short pauses."""
    return lambda k: k % period != 0


@pytest.fixture
def store() -> AuditStore:
    return AuditStore("sqlite:///:memory:").ensure_schema()


# -- name stems -----------------------------------------------------------------------------------


def test_hashes_and_numbers_share_a_stem() -> None:
    assert baselines.name_stem("llama7b-endpoint-3f9a2c") == baselines.name_stem("llama7b-endpoint-00b1c2")
    assert baselines.name_stem("ranker-api-17") == baselines.name_stem("ranker-api-3")
    assert baselines.name_stem("Ranker-API-17") == baselines.name_stem("ranker-api-3")  # case does not matter


@pytest.mark.parametrize("a,b", [("ranker-api-17", "ranker-web-17"), ("llama7b-endpoint-3f9a2c", "llama7b-chat-3f9a2c"),
                                 ("train-1", "eval-1"), ("bert_ft_1", "gpt_ft_1")])
def test_different_words_differ(a: str, b: str) -> None:
    assert baselines.name_stem(a) != baselines.name_stem(b)


def test_class_keys_split_fine_and_coarse() -> None:
    a = job("1", "ranker-api-17", user="carl", account="web")
    b = job("2", "ranker-api-3", user="carl", account="web")
    c = job("3", "ranker-api-3", user="dora", account="web")
    fa, ca, stem = baselines.class_keys(a, 1)
    fb, cb, _ = baselines.class_keys(b, 1)
    fc, cc, _ = baselines.class_keys(c, 1)
    assert stem == "ranker-api-#" and fa == fb and ca == cb == cc
    assert fc != fa  # another user: another fine class, the same coarse one
    assert baselines.class_keys(a, 2)[0] != fa and baselines.class_keys(a, 2)[1] != ca  # GPU count is part of both


# -- the update -----------------------------------------------------------------------------------


def test_observe_is_idempotent_per_data_instant(store: AuditStore) -> None:
    specs = [(job("1", "train-1"), always_but(10), RESIDENT), (job("2", "llama7b-endpoint-3f9a2c"), every(8), RESIDENT)]
    play(store, specs, range(1, 12))
    before = rows(store, "1", "2")
    s = snap_at(12, specs)
    first = baselines.observe(store, s, POLICY, run_id="run-12")
    after_once = rows(store, "1", "2")
    again = baselines.observe(store, snap_at(12, specs), POLICY, run_id="run-12-retry")  # a retried sweep
    after_twice = rows(store, "1", "2")
    assert {j: counts(r) for j, r in after_twice.items()} == {j: counts(r) for j, r in after_once.items()}
    assert after_twice["1"]["run_id"] == "run-12"  # the retry wrote nothing
    assert again == first
    for j in ("1", "2"):
        assert after_once[j]["seen_s"] == pytest.approx(before[j]["seen_s"] + STEP)
    # the next instant adds one interval
    baselines.observe(store, snap_at(13, specs), POLICY, run_id="run-13")
    later = rows(store, "1", "2")
    for j in ("1", "2"):
        assert later[j]["seen_s"] == pytest.approx(after_once[j]["seen_s"] + STEP)
        assert later[j]["data_ts"] == pytest.approx(at(13))
    # job 1 was busy in slot 13 (13 % 10 != 0): the interval counts as active
    assert later["1"]["active_s"] == pytest.approx(after_once["1"]["active_s"] + STEP)


def test_an_older_instant_counts_nothing(store: AuditStore) -> None:
    specs = [(job("1", "train-1"), always_but(10), RESIDENT)]
    play(store, specs, range(1, 6))
    before = counts(rows(store, "1")["1"])
    baselines.observe(store, snap_at(3, specs), POLICY, run_id="late")  # a replayed, older instant
    assert counts(rows(store, "1")["1"]) == before


def test_each_observation_counts_the_time_since_the_last_one_at_most_two_intervals(store: AuditStore) -> None:
    specs = [(job("1", "train-1"), always_but(1000), RESIDENT)]
    play(store, specs, range(1, 5))
    seen = rows(store, "1")["1"]["seen_s"]
    baselines.observe(store, snap_at(4 + 1 / 3, specs), POLICY, run_id="early")  # a manual sweep 10 minutes later
    assert rows(store, "1")["1"]["seen_s"] == pytest.approx(seen + 600)
    baselines.observe(store, snap_at(20, specs), POLICY, run_id="after-an-outage")  # no sweep for 8 hours
    assert rows(store, "1")["1"]["seen_s"] == pytest.approx(seen + 600 + 2 * STEP)


def test_first_and_later_observations_add_up(store: AuditStore) -> None:
    busy = {1, 2, 5}
    specs = [(job("1", "train-1"), lambda k: k in busy, RESIDENT)]
    play(store, specs, range(1, 7))
    r = rows(store, "1")["1"]
    assert r["seen_s"] == pytest.approx(6 * STEP)
    assert r["active_s"] == pytest.approx(3 * STEP)
    assert r["idle_s"] == pytest.approx(3 * STEP) and r["idle_mem_s"] == pytest.approx(3 * STEP)
    assert r["first_seen"] == pytest.approx(at(1)) and r["last_seen"] == pytest.approx(at(6))
    # quiet in slot 6: a spell that began at the start of that interval
    assert r["quiet_since"] == pytest.approx(at(5))


def test_empty_gpus_are_idle_but_not_resident(store: AuditStore) -> None:
    specs = [(job("1", "train-1"), lambda k: False, EMPTY)]
    play(store, specs, range(1, 5))
    r = rows(store, "1")["1"]
    assert r["idle_s"] == pytest.approx(4 * STEP) and r["idle_mem_s"] == 0


# -- wakes ----------------------------------------------------------------------------------------


def test_activity_after_a_quiet_gap_is_one_wake(store: AuditStore) -> None:
    # busy in slot 1, quiet in slots 2 and 3 (an hour: quiet_gap), busy again in slot 4
    specs = [(job("1", "svc-1"), lambda k: k in (1, 4, 5), RESIDENT)]
    play(store, specs, range(1, 6))
    r = rows(store, "1")["1"]
    assert r["wakes"] == 1
    assert r["longest_quiet_s"] == pytest.approx(2 * STEP)
    assert r["quiet_since"] is None  # active now


def test_a_short_pause_is_no_wake(store: AuditStore) -> None:
    # quiet for one slot only (30 minutes < quiet_gap of 1 h), several times
    specs = [(job("1", "train-1"), lambda k: k % 3 != 0, RESIDENT)]
    play(store, specs, range(1, 16))
    r = rows(store, "1")["1"]
    assert r["wakes"] == 0 and r["longest_quiet_s"] == pytest.approx(STEP)


def test_missing_data_is_no_quiet_spell(store: AuditStore) -> None:
    # a job busy throughout; its exporter answered nothing in slots 4-6 (90 minutes)
    specs = [(job("1", "train-1"), lambda k: None if k in (4, 5, 6) else True, RESIDENT)]
    classes = play(store, specs, range(1, 12))
    assert classes["1"]["member_wakes"] == 0
    assert rows(store, "1")["1"]["wakes"] == 0


def test_quiet_gap_comes_from_the_policy(store: AuditStore) -> None:
    p = dataclasses.replace(POLICY, baselines=dataclasses.replace(POLICY.baselines, quiet_gap=STEP))
    specs = [(job("1", "train-1"), lambda k: k % 3 != 0, RESIDENT)]
    play(store, specs, range(1, 16), policy=p)
    assert rows(store, "1")["1"]["wakes"] == 4  # slots 4, 7, 10, 13 follow a 30-minute pause


def test_every_wake_is_counted_over_days(store: AuditStore) -> None:
    # busy one slot in 8 (every 4 h) over 32 h: a wake after every 3.5 h quiet spell (slots 8, 16, ... 64)
    specs = [(job("1", "llama7b-endpoint-3f9a2c"), every(8), RESIDENT)]
    play(store, specs, DAYS)
    r = rows(store, "1")["1"]
    assert r["wakes"] == 8 and r["longest_quiet_s"] == pytest.approx(7 * STEP)


# -- kinds ----------------------------------------------------------------------------------------


SERVICE_NAMES = ("llama7b-endpoint-3f9a2c", "llama7b-endpoint-00b1c2", "llama7b-endpoint-a1b2c3")


def services(*, mem: float = RESIDENT, start: float = T0 - 86400.0, once: bool = False) -> list[Spec]:
    """Three endpoints of one class; ``once``: each wakes only once (under member_min_wakes)."""
    out: list[Spec] = []
    for i, name in enumerate(SERVICE_NAMES):
        busy = (lambda k, i=i: k in (20 + 10 * i, 21 + 10 * i)) if once else every(8, offset=i)
        out.append((job(f"s{i}", name, start=start), busy, mem))
    return out


def trainings() -> list[Spec]:
    return [(job(f"t{i}", f"train-{i}", user="bob", account="ml"), always_but(10), RESIDENT) for i in range(3)]


def test_long_lived_waking_resident_class_is_a_service(store: AuditStore) -> None:
    classes = play(store, services(once=True) + trainings(), DAYS)
    for i in range(3):
        c = classes[f"s{i}"]
        assert c["kind"] == "service" and c["level"] == "fine" and c["members"] == 3 and c["long_lived"] == 3
        assert c["member_wakes"] == 1 and c["member_kind"] is None  # the class decides, not the member
        assert c["busy_share"] <= 0.3 and c["mem_resident_share"] >= 0.8 and c["waking_share"] == 1.0
        assert baselines.is_service(c)
        assert "service" in baselines.describe(c) and "woke from quiet spells" in baselines.describe(c)
    assert classes["s0"]["key"] == baselines.class_keys(services()[0][0], 1)[0]


def test_busy_class_is_training(store: AuditStore) -> None:
    classes = play(store, services() + trainings(), DAYS)
    for i in range(3):
        c = classes[f"t{i}"]
        assert c["kind"] == "training" and c["members"] == 3 and c["busy_share"] >= 0.6
        assert c["member_kind"] is None and not baselines.is_service(c)
    assert all(classes[f"s{i}"]["kind"] == "service" for i in range(3))


def test_young_members_do_not_make_a_service_without_cold_start(store: AuditStore) -> None:
    # the same behaviour, but the jobs started with the sweeps and are seen for only 10 hours (< long_lived 12 h)
    policy = dataclasses.replace(POLICY, baselines=dataclasses.replace(POLICY.baselines, cold_start=0.0))
    specs = services(start=at(1))
    classes = play(store, specs, range(1, 21), policy)
    assert all(classes[f"s{i}"]["long_lived"] == 0 and classes[f"s{i}"]["kind"] != "service" for i in range(3))
    # once they have lived past long_lived they do
    classes = play(store, specs, range(21, 40), policy)
    assert all(classes[f"s{i}"]["kind"] == "service" for i in range(3))


def test_a_young_deployment_is_judged_by_its_siblings_hours(store: AuditStore) -> None:
    # cold start: three members started together 10 hours ago, each woke from quiet spells: a service in hours
    specs = services(start=at(1))
    classes = play(store, specs, range(1, 4))  # 1.5 hours seen: under baselines.cold_start (3 h)
    assert all(classes[f"s{i}"]["kind"] == "unknown" and classes[f"s{i}"]["cold_start_s"] is None for i in range(3))
    classes = play(store, specs, range(4, 21))
    for i in range(3):
        c = classes[f"s{i}"]
        assert c["long_lived"] == 0 and c["kind"] == "service", c
        assert 9 * H <= c["cold_start_s"] <= 10 * H and c["waking_share"] == 1.0 and c["busy_share"] <= 0.3
        assert "young class" in baselines.describe(c)


def test_a_young_class_of_forgotten_jobs_is_no_service(store: AuditStore) -> None:
    # young too, but its members never wake: judged in hours, it is not a service
    specs = [(job(f"s{i}", name, start=at(1)), lambda k: False, RESIDENT) for i, name in enumerate(SERVICE_NAMES)]
    classes = play(store, specs, range(1, 21))
    assert all(classes[f"s{i}"]["kind"] == "unknown" and classes[f"s{i}"]["cold_start_s"] for i in range(3))


def test_a_service_class_needs_min_members_long_lived(store: AuditStore) -> None:
    # four members that all behave like services, but only two have lived long_lived (12 h)
    old = services()[:2]
    young: list[Spec] = [(job(f"y{i}", f"llama7b-endpoint-b{i}c{i}d{i}", start=at(DAYS.stop - 16)), every(8, offset=i + 3), RESIDENT)
             for i in range(2)]
    classes = {}
    for k in DAYS:
        classes = baselines.observe(store, snap_at(k, old + (young if k >= DAYS.stop - 16 else [])), POLICY, run_id=f"run-{k}")
    c = classes["s0"]
    assert c["members"] == 4 and c["long_lived"] == 2 and c["waking_share"] == 1.0
    assert c["kind"] != "service"


def test_members_that_never_wake_are_no_service(store: AuditStore) -> None:
    # three forgotten jobs of one class, model resident, GPUs idle throughout: waste, not a service
    specs = [(job(f"s{i}", name), lambda k: False, RESIDENT) for i, name in enumerate(SERVICE_NAMES)]
    classes = play(store, specs, DAYS)
    for i in range(3):
        c = classes[f"s{i}"]
        assert c["long_lived"] == 3 and c["mem_resident_share"] == 1.0 and c["busy_share"] == 0
        assert c["waking_share"] == 0 and c["kind"] == "unknown" and not baselines.is_service(c)


def test_half_busy_waking_members_are_neither_service_nor_training(store: AuditStore) -> None:
    # busy 2 h of every 4 h: they wake from 2 h quiet spells, but are busy half the time
    specs = [(job(f"s{i}", name), every(8, offset=i, length=4), RESIDENT) for i, name in enumerate(SERVICE_NAMES)]
    classes = play(store, specs, DAYS)
    for i in range(3):
        c = classes[f"s{i}"]
        assert c["waking_share"] == 1.0 and 0.3 < c["busy_share"] < 0.6
        assert c["kind"] == "unknown" and c["member_kind"] is None and not baselines.is_service(c)


def test_empty_memory_while_quiet_is_no_service(store: AuditStore) -> None:
    classes = play(store, services(mem=EMPTY), DAYS)
    for i in range(3):
        c = classes[f"s{i}"]
        assert c["mem_resident_share"] == 0 and c["kind"] != "service"
        assert c["member_kind"] is None and not baselines.is_service(c)


def test_small_fine_class_falls_back_to_the_coarse_class(store: AuditStore) -> None:
    # two ranker endpoints of carl and one of dora: a fine class of 2 (< min_members 3), a coarse class of 3
    specs = [(job("r1", "ranker-api-17", user="carl", account="web"), every(8, offset=0, length=1), RESIDENT),
             (job("r2", "ranker-api-3", user="carl", account="web"), every(8, offset=3, length=1), RESIDENT),
             (job("r3", "ranker-web-3", user="dora", account="web"), every(8, offset=5, length=1), RESIDENT)]
    classes = play(store, specs, DAYS)
    fine, coarse, _ = baselines.class_keys(specs[0][0], 1)
    for jid in ("r1", "r2"):
        c = classes[jid]
        assert c["level"] == "coarse" and c["key"] == coarse and c["members"] == 3 and c["kind"] == "service"
    # with min_members 2 the fine class counts
    p = dataclasses.replace(POLICY, baselines=dataclasses.replace(POLICY.baselines, min_members=2))
    c = baselines.observe(store, snap_at(DAYS.stop, specs, p), p, run_id="next")["r1"]
    assert c["level"] == "fine" and c["key"] == fine and c["members"] == 2


def test_a_lone_fine_class_with_a_lone_coarse_class_is_unknown(store: AuditStore) -> None:
    specs = [(job("x1", "train-1", user="eve", account="solo"), always_but(10), RESIDENT)]
    c = play(store, specs, range(1, 49))["x1"]
    assert c["members"] == 1 and c["kind"] == "unknown"
    assert c["busy_share"] >= 0.6  # busy like training, but one member is not a class


def test_a_member_that_woke_often_is_a_service_alone(store: AuditStore) -> None:
    specs = [(job("x1", "my-odd-server", user="eve", account="solo"), every(8), RESIDENT)]
    c = play(store, specs, range(1, 49))["x1"]
    assert c["members"] == 1 and c["kind"] == "unknown"
    assert c["member_wakes"] >= POLICY.baselines.member_min_wakes and c["member_kind"] == "service"
    assert baselines.is_service(c) and "this job woke" in baselines.describe(c)


def test_a_member_that_woke_once_is_not_a_service_alone(store: AuditStore) -> None:
    specs = [(job("x1", "my-odd-server", user="eve", account="solo"), lambda k: k in (1, 10), RESIDENT)]
    c = play(store, specs, range(1, 30))["x1"]
    assert c["member_wakes"] == 1 and c["member_kind"] is None and not baselines.is_service(c)


def test_a_waking_member_with_empty_memory_is_not_a_service(store: AuditStore) -> None:
    specs = [(job("x1", "my-odd-server", user="eve", account="solo"), every(8), EMPTY)]
    c = play(store, specs, range(1, 49))["x1"]
    assert c["member_wakes"] >= 2 and c["member_kind"] is None and not baselines.is_service(c)


# -- learn=False and enabled=false -----------------------------------------------------------------


def test_learn_false_reads_without_writing(store: AuditStore) -> None:
    specs = services() + trainings()
    s = snap_at(1, specs)
    classes = baselines.observe(store, s, POLICY, run_id="manual", learn=False)
    assert store.fetch("class_members_of_jobs", {"job_ids": [j.job_id for j, _, _ in specs]}) == []
    assert set(s.classes) == {j.job_id for j, _, _ in specs} and s.classes == classes
    # after days of sweeps, a manual read sees what the sweeps learnt and changes nothing
    play(store, specs, DAYS)
    before = {j: counts(r) for j, r in rows(store, "s0", "s1", "s2", "t0").items()}
    s = snap_at(DAYS.stop, specs)
    classes = baselines.observe(store, s, POLICY, run_id="manual", learn=False)
    assert {j: counts(r) for j, r in rows(store, "s0", "s1", "s2", "t0").items()} == before
    assert s.classes["s0"]["kind"] == "service" and s.classes["t0"]["kind"] == "training"


def test_disabled_baselines_learn_nothing_and_say_nothing(store: AuditStore) -> None:
    p = dataclasses.replace(POLICY, baselines=dataclasses.replace(POLICY.baselines, enabled=False))
    specs = services() + trainings()
    for k in range(1, 10):
        s = snap_at(k, specs, p)
        s.classes = {"s0": {"kind": "service"}}  # whatever was there is dropped
        assert baselines.observe(store, s, p, run_id=f"run-{k}") == {}
        assert s.classes == {}
    assert store.fetch("class_members_of_jobs", {"job_ids": [j.job_id for j, _, _ in specs]}) == []


def test_a_job_without_gpus_in_the_metrics_is_not_a_member(store: AuditStore) -> None:
    specs = [(job("1", "train-1"), always_but(10), RESIDENT)]
    s = snap_at(1, specs)
    ghost = dataclasses.replace(job("9", "train-9", start=T0), gpu_alloc=(("elsewhere", (0,)),), nodes=("elsewhere",))
    s = dataclasses.replace(s, jobs=(*s.jobs, ghost))
    classes = baselines.observe(store, s, POLICY, run_id="run-1")
    assert set(classes) == {"1"} and set(rows(store, "1", "9")) == {"1"}


# -- what a process keeps of the members ----------------------------------------------------------


def test_a_process_that_keeps_its_members_sees_what_a_fresh_read_sees(tmp_path) -> None:
    # one process sweeps for days (it reads each class once and keeps what it writes); at every
    # sweep a reader that knows nothing (a new store object on the same database) must see the
    # same classes. Midway, another writer stores newer rows of the same classes: the first
    # process takes them in at its next sweep. Jobs end and start, so members leave and join.
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    sweeper = AuditStore(url).ensure_schema()
    specs = services() + trainings()
    other: list[Spec] = [(job("s9", "llama7b-endpoint-9f9f9f"), every(8, offset=5), RESIDENT),
                         (job("t9", "train-9", user="bob", account="ml"), always_but(10), RESIDENT)]
    for k in DAYS:
        alive = [s for i, s in enumerate(specs) if k < 30 + 8 * i or i == 0]
        if k == 40:
            baselines.observe(AuditStore(url).ensure_schema(), snap_at(k + 0.5, alive + other), POLICY, run_id="other")
        kept = baselines.observe(sweeper, snap_at(k, alive), POLICY, run_id=f"run-{k}")
        fresh = baselines.observe(AuditStore(url).ensure_schema(), snap_at(k, alive), POLICY, run_id="check",
                                  learn=False)
        assert kept == fresh, f"sweep {k}"
    assert kept["s0"]["members"] == 4 and kept["s0"]["kind"] == "service"  # s9, written by the other, counts
    assert rows(sweeper, "s9")["s9"]["run_id"] == "other"


def test_another_store_object_writing_the_same_instant_is_taken_in(tmp_path) -> None:
    # two store objects of one process on one database (a sharded sweep run in one process): the
    # second writes members of the first's classes for the instant the first has just seen; the
    # first's next read must include them
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    first, second = AuditStore(url).ensure_schema(), AuditStore(url).ensure_schema()
    group_a, group_b = services()[:2], services()[2:]
    for k in range(1, 20):
        baselines.observe(first, snap_at(k, group_a), POLICY, run_id=f"a-{k}")
        baselines.observe(second, snap_at(k, group_b), POLICY, run_id=f"b-{k}")
    got = baselines.observe(first, snap_at(19, group_a), POLICY, learn=False)
    assert got["s0"]["members"] == 3
    assert got == baselines.observe(AuditStore(url).ensure_schema(), snap_at(19, group_a), POLICY, learn=False)


def test_a_process_asked_further_back_reads_the_class_again(tmp_path) -> None:
    # a member last seen 10 sweeps in is forgotten a day later (forget_after 1 d) and remembered
    # by a sweep at an earlier instant: a process that read the class for the later sweep must
    # read it again for the earlier one, not answer from what it kept
    p = dataclasses.replace(POLICY, baselines=dataclasses.replace(POLICY.baselines, forget_after=86400.0))
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    writer = AuditStore(url).ensure_schema()
    ended: list[Spec] = [(job("e0", "llama7b-endpoint-0e0e0e"), every(8), RESIDENT)]
    for k in range(1, 11):
        baselines.observe(writer, snap_at(k, services() + ended, p), p, run_id=f"run-{k}")
    reader = AuditStore(url).ensure_schema()
    late = baselines.observe(reader, snap_at(10 + 1.5 * 86400 / STEP, services(), p), p, learn=False)
    early = baselines.observe(reader, snap_at(10 + 0.5 * 86400 / STEP, services(), p), p, learn=False)
    assert late["s0"]["members"] == 3 and early["s0"]["members"] == 4
    assert early == baselines.observe(AuditStore(url).ensure_schema(), snap_at(10 + 0.5 * 86400 / STEP, services(), p),
                                      p, learn=False)


# -- class_stats and describe -----------------------------------------------------------------------


def test_ended_members_give_run_times(store: AuditStore) -> None:
    # three training runs that end one after the other, then a fourth that is still running
    specs_all = [(job(f"t{i}", f"train-{i}", user="bob", account="ml", start=at(1)), always_but(10), RESIDENT)
                 for i in range(4)]
    for k in range(1, 41):
        alive = [s for i, s in enumerate(specs_all) if i == 3 or k <= 10 * (i + 1)]
        classes = baselines.observe(store, snap_at(k, alive), POLICY, run_id=f"run-{k}")
    c = classes["t3"]
    assert c["members"] == 4 and c["ended"] == 3 and c["kind"] == "training"
    # runs of 9, 19 and 29 slots after their first sight (start_ts = at(1)), in seconds
    assert c["runtime_p50_s"] == pytest.approx(19 * STEP)
    assert c["runtime_p90_s"] == pytest.approx((19 + 0.8 * 10) * STEP)


def test_describe_without_a_baseline() -> None:
    assert baselines.describe(None) == "no class baseline yet"
    assert not baselines.is_service(None) and not baselines.is_service({})
    assert baselines.is_service({"kind": "unknown", "member_kind": "service"})


def test_the_class_keeps_its_cpu_gpu_mix_from_nodes_its_members_have_alone() -> None:
    """node_exporter's CPU of a node a job has to itself, while its GPUs are active, is the class's CPU/GPU mix;
    a node shared with another job tells nothing about either."""
    store = AuditStore("sqlite:///:memory:").ensure_schema()
    specs = [(job("c1", "prep-1", user="cpu"), lambda k: True, RESIDENT),
             (job("c2", "prep-2", user="cpu"), lambda k: True, RESIDENT),
             (job("c3", "prep-3", user="cpu"), lambda k: True, RESIDENT)]
    classes: dict[str, dict] = {}
    for k in range(1, 5):
        snap = snap_at(k, specs)
        snap.nodes = tuple(dataclasses.replace(n, cpu_util=40.0) for n in snap.nodes)
        classes = baselines.observe(store, snap, POLICY, run_id=f"run-{k}")
    assert classes["c1"]["cpu_pct_active"] == pytest.approx(40.0)
    assert classes["c1"]["cpu_pct_per_gpu"] == pytest.approx(40.0)
    assert "CPU 40 % of its node while busy" in baselines.describe(classes["c1"])
    # the same three jobs on one shared node: no CPU is attributed to any of them
    store2 = AuditStore("sqlite:///:memory:").ensure_schema()
    for k in range(1, 5):
        snap = snap_at(k, specs)
        cpu_job = Job(job_id="cpu-only", user="bob", start_ts=T0, nodes=("g0", "g1", "g2"))  # no GPUs, on every node
        snap.jobs = (*snap.jobs, cpu_job)
        snap.nodes = tuple(dataclasses.replace(n, cpu_util=90.0) for n in snap.nodes)
        classes = baselines.observe(store2, snap, POLICY, run_id=f"run-{k}")
    assert set(classes) == {"c1", "c2", "c3"}
    assert all(c["cpu_pct_active"] is None for c in classes.values())


def _class_stats_one_class_at_a_time(members: list[dict], now: float, cfg, step: float) -> dict:  # type: ignore[no-untyped-def]
    """The class baselines by their definition, one class after the other (what class_stats computes at once)."""
    import math

    groups: dict[tuple[str, str], list[dict]] = {}
    for m in members:
        groups.setdefault(("fine", m["class_key"]), []).append(m)
        groups.setdefault(("coarse", m["coarse_key"]), []).append(m)
    lam = math.log(2) / cfg.half_life
    out = {}
    for (level, key), ms in groups.items():
        w = [math.exp(-lam * max(0.0, now - m["last_seen"])) for m in ms]
        seen = sum(wi * (m["seen_s"] or 0) for wi, m in zip(w, ms, strict=True))
        idle = sum(wi * (m["idle_s"] or 0) for wi, m in zip(w, ms, strict=True))
        busy = sum(wi * (m["active_s"] or 0) for wi, m in zip(w, ms, strict=True)) / seen if seen else None
        res = sum(wi * (m["idle_mem_s"] or 0) for wi, m in zip(w, ms, strict=True)) / idle if idle else None
        age = [m["last_seen"] - (m["start_ts"] if m["start_ts"] is not None else m["first_seen"]) for m in ms]
        long_lived = [m for m, a in zip(ms, age, strict=True) if a >= cfg.long_lived]
        waking = sum((m["wakes"] or 0) >= 1 for m in long_lived) / len(long_lived) if long_lived else None
        runtimes = np.array([a for m, a in zip(ms, age, strict=True) if m["last_seen"] < now - 2 * step])
        cpu_s = sum(m["cpu_active_s"] or 0 for m in ms)
        cpu_pct = sum(m["cpu_pct_s"] or 0 for m in ms) / cpu_s if cpu_s else None
        gpus_mean = sum(m["gpus"] or 0 for m in ms) / len(ms) or 1.0
        p50, p90 = (round(float(np.quantile(runtimes, 0.5))), round(float(np.quantile(runtimes, 0.9)))) \
            if len(runtimes) else (None, None)
        kind, cold_start, busy, res, waking = _kind(ms, age, long_lived, busy, res, waking, now, cfg, step)
        out[(level, key)] = {
            "kind": kind, "cold_start_s": cold_start,
            "members": len(ms), "long_lived": len(long_lived), "ended": len(runtimes), "busy_share": busy,
            "mem_resident_share": res, "waking_share": waking, "runtime_p50_s": p50, "runtime_p90_s": p90,
            "cpu_pct_active": cpu_pct, "cpu_members": sum(1 for m in ms if (m["cpu_active_s"] or 0) > 0),
            "cpu_pct_per_gpu": cpu_pct / gpus_mean if cpu_pct is not None else None,
        }
    return out


def stats_of_rows(members: list[dict], now: float, cfg, step: float, wanted=None) -> dict:  # type: ignore[no-untyped-def]
    """class_stats over member rows, in their order: their columns as a process gives them (no kept rows)."""
    known = baselines._Known()
    table, fine, coarse = known.columns(np.zeros(0, dtype=np.int64), members)
    return baselines.class_stats(table, fine, coarse, known.class_names, now, cfg, step, wanted)


def _random_members(rng: np.random.Generator, now: float, n: int = 300, first_id: int = 0) -> list[dict]:
    """Member rows of 40 fine classes in 8 coarse ones: ended and running, with and without a start, CPU or idle."""
    members = []
    for i in range(first_id, first_id + n):
        last = float(rng.choice([now, now - STEP, now - 3 * STEP, now - rng.uniform(0, 86400)]))
        first = last - float(rng.uniform(0, 10 * 86400))
        seen = float(rng.uniform(0, last - first + 1))
        fine = int(rng.integers(0, 40))
        members.append({
            "job_id": str(i), "class_key": f"f{fine}", "coarse_key": f"c{rng.integers(0, 8)}",
            "first_seen": first, "last_seen": last, "data_ts": last, "start_ts": None if rng.random() < 0.2 else first - 60.0,
            "seen_s": seen, "active_s": float(rng.uniform(0, seen)), "idle_s": float(rng.uniform(0, seen)) or None,
            "idle_mem_s": float(rng.uniform(0, seen)), "wakes": int(rng.integers(0, 3)), "gpus": int(rng.integers(0, 9)),
            "cpu_active_s": 0.0 if fine >= 36 or rng.random() < 0.4 else float(rng.uniform(0, seen)),
            "cpu_pct_s": float(rng.uniform(0, 100 * seen)),
        })
    return members


@pytest.mark.parametrize("seed", range(8))
def test_the_columns_a_process_keeps_describe_the_classes_as_the_member_rows_do(seed: int) -> None:
    """A sweep's classes from the columns its process keeps (the members' figures by place, its own rows over them,
    new ones after) equal class_stats over the member rows themselves, in the order the sweep reads them."""
    rng = np.random.default_rng(seed)
    cfg = POLICY.baselines
    members = _random_members(rng, NOW)
    known = baselines._Known()
    for m in members:
        known._put_all([dict(m)], newer_only=False)
    # this sweep: some kept members seen again (their figures moved on), and two jobs the process never kept
    own = [{**m, "last_seen": NOW, "seen_s": m["seen_s"] + STEP, "active_s": m["active_s"] + STEP}
           for m in rng.choice(members, size=12, replace=False)] + _random_members(rng, NOW, n=2, first_id=1000)
    fine, coarse = {str(r["class_key"]) for r in own}, {str(r["coarse_key"]) for r in own}
    since = NOW - float(rng.uniform(0.2, 0.8)) * 86400  # some members last seen before it
    slots = known.of_classes(AuditStore("sqlite:///:memory:").ensure_schema(), fine, coarse, since)
    table, fine_of, coarse_of = known.columns(slots, own)
    wanted = {("fine", k) for k in fine} | {("coarse", k) for k in coarse}
    got = baselines.class_stats(table.copy(), fine_of, coarse_of, known.class_names, NOW, cfg, STEP, wanted)
    # the wanted classes found by the numbers the process keeps, as a sweep finds them: the same classes
    assert baselines.class_stats(table, fine_of, coarse_of, known.class_names, NOW, cfg, STEP, wanted,
                                 known.numbers) == got
    # by definition: the kept members of those classes (fine keys sorted, then coarse; each class's members as
    # kept) seen after ``since``, each job once, its own row in its place, the others after
    ids = {m["job_id"]: None for level, keys in (("class_key", fine), ("coarse_key", coarse)) for k in sorted(keys)
           for m in members if m[level] == k}
    by_id = {j: r for j in ids if (r := known.rows[j])["last_seen"] > since}
    by_id.update({r["job_id"]: r for r in own})
    want = stats_of_rows(list(by_id.values()), NOW, cfg, STEP, wanted=wanted)
    assert got == want and len(want) == len(wanted)


@pytest.mark.parametrize("seed", range(10))
def test_a_sweep_reads_its_classes_members_in_the_order_their_rows_came(seed: int) -> None:
    """The places a sweep reads name each member once, fine classes (keys sorted) before coarse ones, each class's
    members in the order their rows were last kept: a row kept again (a later instant) goes after the others of its
    class, or into its new class; an older one changes nothing. As per-class lists that move a job to their end."""
    rng = np.random.default_rng(seed)
    members = _random_members(rng, NOW, n=200)
    known = baselines._Known()
    lists: dict[tuple[str, str], dict[str, None]] = {}
    kept: dict[str, dict] = {}

    def keep(row: dict, newer_only: bool) -> None:
        old = kept.get(row["job_id"])
        if old is not None:
            if newer_only and row["data_ts"] <= old["data_ts"]:
                return
            lists[("fine", old["class_key"])].pop(row["job_id"])
            lists[("coarse", old["coarse_key"])].pop(row["job_id"])
        kept[row["job_id"]] = row
        lists.setdefault(("fine", row["class_key"]), {})[row["job_id"]] = None
        lists.setdefault(("coarse", row["coarse_key"]), {})[row["job_id"]] = None

    batches = [members[:120], members[120:]]
    for _ in range(3):  # later instants of some members, a few in another class, a few older than kept
        batch = []
        for m in rng.choice(members, size=40, replace=False):
            row = {**kept.get(m["job_id"], m), "data_ts": float(m["data_ts"]) + float(rng.choice([-STEP, STEP, 2 * STEP]))}
            if rng.random() < 0.2:
                row["class_key"] = f"f{rng.integers(0, 40)}"
            batch.append(row)
        batches.append(batch)
    for k, batch in enumerate(batches):
        newer_only = k >= 2 and k % 2 == 0
        known._put_all([dict(r) for r in batch], newer_only=newer_only)
        for r in batch:
            keep(dict(r), newer_only)
    fine = {f"f{k}" for k in rng.choice(40, size=12, replace=False)}
    coarse = {f"c{k}" for k in rng.choice(8, size=3, replace=False)}
    since = NOW - float(rng.uniform(0.2, 0.8)) * 86400
    slots = known.of_classes(AuditStore("sqlite:///:memory:").ensure_schema(), fine, coarse, since)
    ids = {j: None for level, keys in (("fine", fine), ("coarse", coarse)) for k in sorted(keys)
           for j in lists.get((level, k), {})}
    want = [j for j in ids if kept[j]["last_seen"] > since]
    job_of = {k: j for j, k in known.slot.items()}
    assert [job_of[k] for k in slots.tolist()] == want and len(want) > 20
    assert known.rows == kept


@pytest.mark.parametrize(("draw", "seed"), [("figures", s) for s in range(3)] + [("kinds", s) for s in range(12)])
def test_class_stats_at_once_equal_the_classes_taken_one_at_a_time(draw: str, seed: int) -> None:
    """Over random members (``figures``: every figure; ``kinds``: classes drawn as services, training, young
    deployments or a mix, near each threshold), every class's figures, kind and cold start equal its definition."""
    rng = np.random.default_rng(seed)
    cfg, now = POLICY.baselines, NOW
    members = _random_members(rng, now) if draw == "figures" else _members_of_kinds(rng, now)
    got = stats_of_rows(members, now, cfg, STEP)
    want = _class_stats_one_class_at_a_time(members, now, cfg, STEP)
    assert list(got) == list(want) and len(want) >= 30
    for k, w in want.items():
        g = got[k]
        for field, value in w.items():
            if field.endswith("_share") or field.startswith("cpu_pct"):
                assert g[field] == (None if value is None else pytest.approx(round(value, 3), abs=1e-3)), (k, field)
            else:
                assert g[field] == value, (k, field)
    assert any(g["runtime_p90_s"] is not None for g in got.values())
    assert any(g["cpu_pct_active"] is None for g in got.values()) and any(g["waking_share"] for g in got.values())


def _kind(ms: list[dict], age: list[float], long_lived: list[dict], busy: float | None, res: float | None,  # type: ignore[no-untyped-def]
          waking: float | None, now: float, cfg, step: float) -> tuple[str, int | None, float | None, float | None, float | None]:
    """A class's kind and cold start by the module's rules: a service (long-lived members, rarely busy, memory
    resident while quiet, waking), training (busy), or a young class judged by its running members' hours since the
    cold start (its busy, resident and waking shares then those hours'); unknown otherwise. Returns the kind, the cold
    start (None: not young) and the class's busy, resident and waking shares."""
    kind = "unknown"
    if (len(ms) >= cfg.min_members and len(long_lived) >= cfg.min_members and busy is not None
            and busy <= cfg.service_max_busy_share and res is not None and res >= cfg.service_min_mem_resident
            and waking is not None and waking >= cfg.service_min_waking_share):
        kind = "service"
    elif len(ms) >= cfg.min_members and busy is not None and busy >= baselines.TRAINING_MIN_BUSY:
        kind = "training"
    cold = [m for m in ms if m["last_seen"] >= now - 2 * step and (m["seen_s"] or 0) >= cfg.cold_start
            and (m["seen_s"] or 0) > 0]
    young = (kind == "unknown" and len(long_lived) < cfg.min_members and max(age) < cfg.long_lived
             and len(cold) >= cfg.min_members)
    if young:
        c_busy = sum((m["active_s"] or 0) / m["seen_s"] for m in cold) / len(cold)
        quiet = [m for m in cold if (m["idle_s"] or 0) > 0]
        c_res = sum((m["idle_mem_s"] or 0) / m["idle_s"] for m in quiet) / len(quiet) if quiet else None
        c_woke = sum((m["wakes"] or 0) >= 1 for m in cold) / len(cold)
        if (c_busy <= cfg.service_max_busy_share and c_res is not None and c_res >= cfg.service_min_mem_resident
                and c_woke >= cfg.service_min_waking_share):
            kind = "service"
        elif c_busy >= baselines.TRAINING_MIN_BUSY:
            kind = "training"
        return kind, round(max(age)), c_busy, c_res, c_woke
    return kind, None, busy, res, waking


def _members_of_kinds(rng: np.random.Generator, now: float) -> list[dict]:
    """Member rows of classes each drawn as a service, training, a young deployment or a mix (some small, some with a
    member that ran under an hour): every kind and the cold start, near each threshold as well as far from it."""
    members = []
    for c in range(30):
        regime = rng.choice(["service", "training", "young service", "young training", "mixed"])
        for i in range(int(rng.integers(1, 7))):
            young = regime.startswith("young") or (regime == "mixed" and rng.random() < 0.5)
            last = now if young or rng.random() < 0.5 else now - float(rng.uniform(3 * STEP, 86400))
            first = last - (float(rng.uniform(0.5, 11)) * 3600 if young else float(rng.uniform(0.4, 10)) * 86400)
            seen = float(rng.uniform(0.5, 1.0)) * (last - first)
            busy = rng.uniform(0.0, 0.35) if regime.endswith("service") else (
                rng.uniform(0.55, 1.0) if regime.endswith("training") else rng.uniform(0, 1))
            idle = seen * (1 - float(busy)) or None
            members.append({
                "job_id": f"{c}-{i}", "class_key": f"f{c}", "coarse_key": f"c{c % 6}", "first_seen": first,
                "last_seen": last, "data_ts": last, "start_ts": None if rng.random() < 0.3 else first - 60.0,
                "seen_s": seen, "active_s": seen * float(busy), "idle_s": idle,
                "idle_mem_s": (idle or 0.0) * float(rng.choice([1.0, 0.9, 0.75, 0.2])),
                "wakes": int(rng.choice([0, 1, 3], p=[0.8, 0.1, 0.1] if regime.endswith("training") else [0.3, 0.3, 0.4])),
                "gpus": int(rng.integers(1, 9)), "cpu_active_s": 0.0, "cpu_pct_s": 0.0,
            })
    return members


def test_the_classes_of_kinds_show_every_kind_and_young_classes() -> None:
    """The ``kinds`` draws above judge services, training, unknown and young classes, not one kind over and over."""
    seen = [(w["kind"], w["cold_start_s"]) for seed in range(12) for w in _class_stats_one_class_at_a_time(
        _members_of_kinds(np.random.default_rng(seed), NOW), NOW, POLICY.baselines, STEP).values()]
    kinds = [k for k, _ in seen]
    assert min(kinds.count(k) for k in ("service", "training", "unknown")) >= 10
    young = [k for k, cold_start in seen if cold_start is not None]
    assert min(young.count(k) for k in ("service", "unknown")) >= 3, young  # a young class busy enough is training


def test_a_young_class_whose_counted_members_never_idled_has_no_resident_share() -> None:
    """A young class is judged by its members seen since the cold start: when none of them was ever idle, it has no
    memory-resident share, though its newer members (seen for less than the cold start) idled with memory held."""
    cfg = POLICY.baselines
    seen = 4 * 3600.0
    busy = [{"job_id": f"b{i}", "class_key": "f", "coarse_key": "c", "first_seen": NOW - seen, "last_seen": NOW,
             "data_ts": NOW, "start_ts": NOW - seen, "seen_s": seen, "active_s": seen, "idle_s": 0.0,
             "idle_mem_s": 0.0, "wakes": 0, "gpus": 1, "cpu_active_s": 0.0, "cpu_pct_s": 0.0} for i in range(3)]
    newer = [{**busy[0], "job_id": f"n{i}", "first_seen": NOW - 7200, "start_ts": NOW - 7200, "seen_s": 7200.0,
              "active_s": 0.0, "idle_s": 7200.0, "idle_mem_s": 7200.0} for i in range(6)]
    assert newer[0]["seen_s"] < cfg.cold_start <= seen
    members = [*busy, *newer]
    got = stats_of_rows(members, NOW, cfg, STEP)
    want = _class_stats_one_class_at_a_time(members, NOW, cfg, STEP)
    for key in (("fine", "f"), ("coarse", "c")):
        # the whole class is mostly idle, resident: its counted members' hours make it a young training class
        assert got[key]["cold_start_s"] == want[key]["cold_start_s"] == round(seen)
        assert got[key]["kind"] == want[key]["kind"] == "training"
        assert got[key]["busy_share"] == want[key]["busy_share"] == 1.0
        assert got[key]["mem_resident_share"] is None and want[key]["mem_resident_share"] is None


# -- a job's state, every job at once ---------------------------------------------------------------------------
def _job_state_by_definition(g: pd.DataFrame, policy: Policy) -> dict[str, tuple[int, bool, bool, bool]]:
    """A job's state read row by row: fresh GPUs (not stale, utilisation seen), active when a fresh one is at the
    idle threshold, idle when all are fresh and none is, resident when idle with every GPU's memory above the floor."""
    thr, floor = policy.rules.idle_allocation.util_max, policy.rules.zombie.mem_min_mib
    out = {}
    for jid in {j for j in g["job_id"] if j}:
        rows = g[g["job_id"] == jid]
        fresh = rows[~rows["stale"] & rows["util_max"].notna()]
        active = bool((fresh["util_max"] >= thr).any())
        idle = len(fresh) == len(rows) and not active
        resident = idle and bool((rows["mem_min_mib"].fillna(0.0) > floor).all())
        out[jid] = (len(rows), active, idle, resident)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_job_state_at_once_equals_its_definition_row_by_row(seed: int) -> None:
    rng = np.random.default_rng(seed)
    policy = Policy()
    thr, floor = policy.rules.idle_allocation.util_max, policy.rules.zombie.mem_min_mib
    n = int(rng.integers(1, 60))
    # utilisation around the threshold (and on it), memory around the floor, some of each missing, some rows stale
    util = rng.choice([0.0, thr / 2, thr, thr + 1, 90.0, np.nan], size=n)
    mem = rng.choice([0.0, floor, floor + 1, 20000.0, np.nan], size=n)
    ids = rng.choice(["", "1", "2", "3", "4", "5"], size=n)
    jobs = [Job(job_id=j, user="ann", state="RUNNING", start_ts=T0) for j in sorted(set(ids) - {""})]
    gpus = pd.DataFrame({"job_id": [j or None for j in ids], "stale": rng.random(n) < 0.15, "util_max": util,
                         "mem_min_mib": mem})
    snap = Snapshot(ts=NOW, window_s=600.0, lookback_s=3600.0, source="test", jobs=tuple(jobs), gpus=gpus)
    assert baselines._job_state(snap, policy) == _job_state_by_definition(gpus.assign(job_id=ids), policy)
