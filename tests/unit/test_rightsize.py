"""Right-sizing at submission: what a sweep records a job needed, the advice computed from finished jobs,
the advice file the Slurm cli_filter reads, and how often later jobs followed it."""

from __future__ import annotations

import dataclasses
import json
import math
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from gpu_cost.audit.store import AuditStore
from gpu_cost.capacity import rightsize
from gpu_cost.config.schema import Policy, RightsizeConfig
from gpu_cost.core.model import Job, Node
from gpu_cost.perceive.snapshot import from_matrix
from gpu_cost.report.usage import gpus_needed, record_usage
from tests.fixtures.core import NOW

STEP = 300.0
H = 3600.0


def policy(**knobs: Any) -> Policy:
    base = Policy()
    return dataclasses.replace(base, rightsize=dataclasses.replace(base.rightsize, **knobs))


@pytest.fixture
def store() -> AuditStore:
    return AuditStore("sqlite:///:memory:").ensure_schema()


def job_rows(job_id: str, *, user: str = "alice", name: str = "train-1", gpus: int = 8, needs: list[int],
             start: float, limit: float | None = 86400.0, mem: float | None = 9000.0) -> list[dict[str, Any]]:
    """The ``gpu_cost_jobs_usage`` rows the sweeps wrote for one job: one per sweep, ``needs[k]`` GPUs needed at sweep k."""
    return [{"ts": start + (k + 1) * STEP, "job_id": job_id, "interval_s": STEP, "user_name": user, "account": "nlp",
             "partition_name": "gpu", "gpu_model": "a100", "job_name": name, "gpus": gpus, "gpus_requested": gpus,
             "gpus_busy": n, "gpus_active": n, "gpus_stale": 0, "work_gpus": 0.8 * n, "time_limit_s": limit,
             "start_ts": start, "gpus_needed": n, "mem_max_mib": mem, "mem_total_mib": 81920.0,
             "run_id": "sweep", "data_ts": start + (k + 1) * STEP}
            for k, n in enumerate(needs)]


def history(store: AuditStore, n: int, *, first: int = 0, user: str = "alice", name: str = "train-{i}",
            gpus: int = 8, needs: list[int] | None = None, start: float = NOW - 6 * 86400.0, **kw: Any) -> None:
    """``n`` finished jobs, one every 4 hours from ``start``; each runs 12 sweeps (an hour)."""
    rows = []
    for i in range(first, first + n):
        rows += job_rows(f"{user}-{i}", user=user, name=name.format(i=i), gpus=gpus, needs=needs or [1] * 12,
                         start=start + i * 4 * H, **kw)
    store.execute("upsert_job_usage", rows)


def still_running(store: AuditStore, at: float = NOW) -> None:
    """A job seen by the newest sweep (the jobs before it are finished)."""
    store.execute("upsert_job_usage", job_rows("running", user="zed", needs=[8], start=at - STEP))


def by_key(rows: list[rightsize.Advice]) -> dict[tuple[str, str, str], rightsize.Advice]:
    return {(a.scope, a.user, a.stem): a for a in rows}


# -- what a sweep records --------------------------------------------------------------------------
@pytest.mark.parametrize(("held", "busy", "stale", "work", "mem", "total", "need"), [
    (8, 1, 0, 0.9, [], [], 1),
    (8, 1, 2, 0.9, [], [], 3),                      # no fresh data counts as busy
    (8, 0, 0, 2.2, [], [], 3),                      # work spread thin over many GPUs: its GPU-equivalents, up
    (8, 0, 0, 0.0, [], [], 0),
    (4, 0, 0, 0.1, [60000.0] * 4, [81920.0] * 4, 3),  # a model sharded over GPUs it barely computes on
    (4, 0, 0, 0.1, [60000.0] * 4, [np.nan] * 4, 1),   # framebuffer size unknown: memory says nothing
    (2, 2, 1, 5.0, [80000.0] * 2, [81920.0] * 2, 2),  # never more than it holds
], ids=["one-busy", "stale-counts", "thin-work", "idle", "memory", "memory-unknown", "capped"])
def test_gpus_needed(held: int, busy: int, stale: int, work: float, mem: list[float], total: list[float],
                     need: int) -> None:
    assert gpus_needed(held, busy, stale, work, mem, total) == need


def _snapshot(now: float, util: list[float], mem: list[float], pol: Policy) -> Any:
    si = pol.sweep.sample_interval
    times = np.arange(now - pol.sweep.lookback + si, now + 1, si)
    n = len(util)
    job = Job("42", "alice", start_ts=now - 2 * H, name="llm-finetune-7", gpu_alloc=(("g0", tuple(range(n))),),
              nodes=("g0",), gpus_requested=n, time_limit_s=86400.0, account="nlp", partition="gpu")
    return from_matrix(
        policy=pol, now=now, source="test", hosts=np.array(["g0"] * n, dtype=object), gpus=np.arange(n),
        uuids=np.array([f"GPU-{i}" for i in range(n)], dtype=object), models=np.array(["a100"] * n, dtype=object),
        mem_total=np.full(n, 81920.0), times=times, util=np.array([[u] * len(times) for u in util]),
        mem=np.array([[m] * len(times) for m in mem]), power=None, job=np.full((n, len(times)), "", dtype=object),
        jobs=(job,), processes=(), nodes=(Node("g0", state="mixed", gpus_total=n, gpus_alloc=n),),
    )


@pytest.mark.parametrize(("util", "mem", "need"), [
    ([85.0, 0.0, 0.0, 0.0], [30000.0, 500.0, 500.0, 500.0], 1),
    ([85.0, 0.0, 0.0, 0.0], [60000.0, 60000.0, 60000.0, 500.0], 3),
    ([85.0, 70.0, 90.0, 60.0], [30000.0] * 4, 4),
], ids=["one-of-four", "memory-on-three", "all-busy"])
def test_a_sweep_records_what_each_job_needed(store: AuditStore, util: list[float], mem: list[float],
                                              need: int) -> None:
    pol = Policy()
    record_usage(store, _snapshot(NOW, util, mem, pol), pol)
    (row,) = store.query("SELECT gpus, gpus_needed, mem_max_mib, mem_total_mib FROM gpu_cost_jobs_usage")
    assert (row["gpus"], row["gpus_needed"], row["mem_max_mib"], row["mem_total_mib"]) == (4, need, max(mem), 81920.0)


def test_the_migration_backfills_what_older_rows_needed(tmp_path: Path) -> None:
    from tests.unit.test_audit_migrations import BASELINE_ROWS, fill_baseline

    url = f"sqlite:///{tmp_path / 'old.db'}"
    fill_baseline(sa.create_engine(url))
    old = {**BASELINE_ROWS["gpu_cost_jobs_usage"][0], "job_id": "8", "gpus": 4, "gpus_busy": 1, "gpus_stale": 1,
           "work_gpus": 2.3}
    with sa.create_engine(url).begin() as conn:
        conn.execute(sa.text(f"INSERT INTO gpu_cost_jobs_usage ({', '.join(old)}) VALUES "
                             f"({', '.join(':' + k for k in old)})"), {**old, "ts": "2026-05-28T20:26:40Z"})
    store = AuditStore(url).ensure_schema()
    got = {r["job_id"]: r["gpus_needed"] for r in store.query("SELECT job_id, gpus_needed FROM gpu_cost_jobs_usage")}
    assert got == {"7": 0, "8": 3}  # job 8: its work (2.3 GPUs) rounds up past its busy + stale GPUs


# -- the advice ------------------------------------------------------------------------------------
def test_jobs_that_asked_eight_and_kept_one_busy_are_advised_one(store: AuditStore) -> None:
    history(store, 6)
    still_running(store)
    rows = by_key(rightsize.compute(store, policy(), NOW))
    cls, usr = rows[("class", "alice", "train-#")], rows[("user", "alice", "")]
    for a in (cls, usr):
        assert (a.status, a.jobs, a.gpus_asked, a.gpus_need, a.gpus_advice, a.ask_min) == ("advice", 6, 8, 1, 1, 2)
        assert a.block_above == 0
        # 12 sweeps of 5 minutes plus the interval it ended in, + 25 %, up to a quarter hour: 1:30:00 of 24 h asked
        assert (a.runtime_s, a.time_asked_s, a.time_advice_s, a.time_ask_min_s) == (3900.0, 86400.0, 5400.0, 10800.0)
        assert a.idle_gpu_hours == pytest.approx(6 * 12 * 7 * STEP / H)
    assert "--gpus=1" in cls.gpus_text and "--time=1:30:00" in cls.time_text and "train-#" in cls.head
    assert ("user", "zed", "") not in rows  # the running job is no history yet


def test_too_few_finished_jobs_say_nothing(store: AuditStore) -> None:
    history(store, 4)
    still_running(store)
    assert rightsize.compute(store, policy(), NOW) == []
    assert by_key(rightsize.compute(store, policy(min_jobs=4), NOW))[("user", "alice", "")].gpus_advice == 1


def test_a_job_busy_on_all_its_gpus_now_and_then_needs_them(store: AuditStore) -> None:
    # 10 of 12 samples on one GPU, two on all eight: p90 of the samples is 8, the median 1
    history(store, 6, needs=[1] * 10 + [8] * 2)
    still_running(store)
    assert by_key(rightsize.compute(store, policy(), NOW))[("user", "alice", "")].gpus_advice == 0
    assert by_key(rightsize.compute(store, policy(quantile=0.5), NOW))[("user", "alice", "")].gpus_advice == 1


@pytest.mark.parametrize(("asked", "need", "advice"), [(8, 4, 4), (8, 5, 0), (4, 3, 0), (2, 1, 1), (2, 0, 1)],
                         ids=["half", "not-half", "three-of-four", "one-of-two", "idle-still-one"])
def test_gpu_advice_only_when_it_saves_enough(store: AuditStore, asked: int, need: int, advice: int) -> None:
    history(store, 5, gpus=asked, needs=[need] * 12)
    still_running(store)
    a = by_key(rightsize.compute(store, policy(), NOW))[("user", "alice", "")]
    assert a.gpus_advice == advice
    if advice:
        assert a.ask_min == max(advice + 1, math.ceil(advice / 0.5)) <= asked


def test_a_class_that_uses_its_gpus_is_not_given_its_users_advice(store: AuditStore) -> None:
    history(store, 6, name="debug-{i}", gpus=4, needs=[1] * 12, limit=2 * H)  # tight limits: GPU advice only
    history(store, 6, first=6, name="pretrain-{i}", gpus=4, needs=[4] * 12, limit=2 * H)
    still_running(store)
    rows = rightsize.compute(store, policy(), NOW)
    keyed = by_key(rows)
    assert keyed[("class", "alice", "debug-#")].gpus_advice == 1
    assert keyed[("class", "alice", "pretrain-#")].status == "fits"
    assert keyed[("user", "alice", "")].gpus_advice == 0  # half her 4-GPU jobs need all four
    stored = rightsize.index_rows({**dataclasses.asdict(a), "user_name": a.user} for a in rows)
    assert (rightsize.in_force(stored, "alice", "pretrain-#") or {})["status"] == "fits"
    assert (rightsize.in_force(stored, "alice", "debug-#") or {})["gpus_advice"] == 1
    assert (rightsize.in_force(stored, "alice", "other") or {})["scope"] == "user"
    assert rightsize.in_force(stored, "bob", "debug-#") is None


def test_jobs_the_agent_ended_do_not_shorten_the_time_advice(store: AuditStore) -> None:
    # six jobs run an hour; five more were cancelled by the agent after ten minutes
    history(store, 6)
    history(store, 5, first=6, needs=[0, 0])
    still_running(store)
    for i in range(6, 11):
        aid = f"d{i}:cancel"
        store.action_started(action_id=aid, decision_id=f"d{i}", run_id="r", action="cancel", target=f"job:alice-{i}",
                             executor="slurm", dry_run=False, started_at=NOW - 3 * 86400.0)
        store.action_finished(aid, "succeeded", NOW - 3 * 86400.0 + 5)
    a = by_key(rightsize.compute(store, policy(), NOW))[("user", "alice", "")]
    assert (a.jobs, a.time_jobs, a.runtime_s, a.time_advice_s) == (11, 6, 3900.0, 5400.0)
    assert a.gpus_need == 1  # their GPUs still count: idle, they needed none


def test_no_time_advice_without_a_limit_or_for_a_tight_one(store: AuditStore) -> None:
    history(store, 6, limit=None)
    history(store, 6, user="bob", limit=2 * H)  # 1:30:00 would not be half of 2 h
    still_running(store)
    rows = by_key(rightsize.compute(store, policy(), NOW))
    assert rows[("user", "alice", "")].time_advice_s == 0 and rows[("user", "bob", "")].time_advice_s == 0
    assert rows[("user", "bob", "")].runtime_s == 3900.0


def test_block_refuses_above_the_factor(store: AuditStore) -> None:
    history(store, 6)
    still_running(store)
    a = by_key(rightsize.compute(store, policy(block=True, block_factor=3.5), NOW))[("user", "alice", "")]
    assert a.block_above == 4 and "more than 4 GPU(s)" in a.block_text


# -- the advice file -------------------------------------------------------------------------------
def test_the_advice_file_is_one_clean_line_per_row(store: AuditStore, tmp_path: Path) -> None:
    history(store, 6, name="evil\tname\n{i}\x1b[31m")
    history(store, 6, user="bob", needs=[8] * 12, limit=2 * H)  # fits: kept, so sbatch prefers it to nothing
    still_running(store)
    out = tmp_path / "etc" / "gpu-cost-advice.tsv"
    summary = rightsize.publish(store, policy(), NOW, run_id="r1", out=out)
    text = out.read_text(encoding="utf-8")
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    lines = text.splitlines()
    assert lines[0] == rightsize.FILE_MAGIC
    data = [ln.split("\t") for ln in lines if not ln.startswith("#")]
    assert all(len(f) == len(rightsize.FILE_COLUMNS) for f in data)
    assert all(c.isprintable() for f in data for c in "".join(f))
    assert [(f[0], f[1]) for f in data] == [("class", "alice"), ("class", "bob"), ("user", "alice"), ("user", "bob")]
    assert data[1][4] == "0" and data[1][8] == ""  # bob's class fits: no advice, no words
    assert summary["file"] == str(out) and (summary["rows"], summary["advice"]) == (4, 2)
    # the same history and instant: the same bytes and rows
    rightsize.publish(store, policy(), NOW, run_id="r2", out=out)
    assert out.read_text(encoding="utf-8") == text
    assert store.query("SELECT COUNT(*) AS n, MAX(run_id) AS run FROM gpu_cost_rightsize")[0] == {"n": 4, "run": "r2"}


def test_an_older_run_never_replaces_newer_advice(store: AuditStore, tmp_path: Path) -> None:
    """The file carries its data instant; a re-run of an older nightly leaves the newer file (and says so)."""
    history(store, 6, start=NOW - 9 * 86400.0)  # finished by the older instant: alice asked 8, needed 1
    still_running(store, at=NOW - 2 * 86400.0)
    history(store, 6, first=6, user="bob", needs=[2] * 12, start=NOW - 2 * 86400.0 + H)  # only the newer sees bob
    still_running(store)
    out = tmp_path / "gpu-cost-advice.tsv"
    newer = rightsize.publish(store, policy(), NOW, run_id="newer", out=out)
    text = out.read_text(encoding="utf-8")
    assert rightsize.file_instant(out) == NOW and "\tbob\t" in text
    older = rightsize.publish(store, policy(), NOW - 2 * 86400.0, run_id="older", out=out)
    assert out.read_text(encoding="utf-8") == text
    assert older["file"] is None and older["kept"] == {"file": str(out), "at": newer["at"]}
    # the older run's rows are kept under their own instant, as not published; the newer ones are in force
    published = {r["run_id"]: r["advice_file"] for r in store.query("SELECT DISTINCT run_id, advice_file FROM gpu_cost_rightsize")}
    assert published == {"newer": str(out), "older": None}
    # a re-run of the newer instant writes again; a later one replaces it
    assert rightsize.publish(store, policy(), NOW, run_id="again", out=out)["file"] == str(out)
    assert rightsize.publish(store, policy(), NOW + 86400.0, run_id="later", out=out)["file"] == str(out)
    assert rightsize.file_instant(out) == NOW + 86400.0


def test_an_advice_file_without_an_instant_is_replaced(store: AuditStore, tmp_path: Path) -> None:
    """A file an earlier version wrote (no instant line), or one that is not ours, is no newer advice."""
    history(store, 6)
    still_running(store)
    for old in (rightsize.FILE_MAGIC + "\n# from the GPU jobs ...\nuser\talice\t\t9\t9\t0\t0\t0\tx\ty\tz\tw\n",
                "something else\n"):
        out = tmp_path / "advice.tsv"
        out.write_text(old)
        assert rightsize.file_instant(out) is None
        assert rightsize.publish(store, policy(), NOW, out=out)["file"] == str(out)
        assert rightsize.file_instant(out) == NOW


def test_no_file_when_the_policy_names_none(store: AuditStore) -> None:
    history(store, 6)
    still_running(store)
    out = rightsize.publish(store, policy(advice_file=""), NOW)
    assert out["file"] is None and out["advice"] == 2
    assert {r["advice_file"] for r in store.query("SELECT advice_file FROM gpu_cost_rightsize")} == {None}


def test_a_relative_advice_file_is_under_the_state_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPU_COST_HOME", str(tmp_path))
    assert rightsize.advice_path(policy()) == tmp_path / "gpu-cost-advice.tsv"
    assert rightsize.advice_path(policy(advice_file="/etc/slurm/a.tsv")) == Path("/etc/slurm/a.tsv")


def test_an_unwritable_advice_file_is_a_clear_error(store: AuditStore, tmp_path: Path) -> None:
    from gpu_cost.core.errors import GpuCostError

    history(store, 6)
    still_running(store)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    with pytest.raises(GpuCostError, match="cannot write the right-sizing advice file"):
        rightsize.publish(store, policy(), NOW, out=blocker / "advice.tsv")
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_rightsize")[0]["n"] == 0


# -- followed? -------------------------------------------------------------------------------------
def test_later_jobs_that_asked_for_the_advice_count_as_followed(store: AuditStore) -> None:
    history(store, 6)
    history(store, 6, user="carol", needs=[2] * 12, gpus=2, limit=2 * H)  # carol's jobs fit: never advised
    still_running(store)
    rightsize.publish(store, policy(advice_file=""), NOW)
    later = NOW + 3600.0
    rows = []
    for jid, gpus, limit in (("a1", 1, 5400.0), ("a2", 1, 86400.0), ("a3", 8, 86400.0), ("a4", 2, 5400.0)):
        rows += job_rows(jid, gpus=gpus, needs=[1, 1], start=later, limit=limit)
    rows += job_rows("c1", user="carol", gpus=8, needs=[2, 2], start=later)
    rows += job_rows("old", gpus=8, needs=[1, 1], start=NOW - 1800.0)  # started before the advice
    store.execute("upsert_job_usage", rows)
    out = rightsize.followed(store, NOW - 86400.0, NOW + 86400.0)
    assert out is not None
    # a1 followed both; a2 the GPUs, not the time; a3 neither; a4 (2 GPUs = ask_min) not the GPUs, the time yes
    assert (out["advised_jobs"], out["followed"], out["followed_share"]) == (4, 1, 0.25)
    assert out["gpus"] == {"advised": 4, "followed": 2} and out["time"] == {"advised": 4, "followed": 2}
    assert out["by_user"] == [{"user": "alice", "advised": 4, "followed": 1, "ignored": 3}]
    assert (out["advice_rows"], out["advised_users"], out["blocking"]) == (2, 1, False)


def test_followed_is_none_before_any_advice(store: AuditStore) -> None:
    assert rightsize.followed(store, NOW - 86400.0, NOW) is None


# -- the command line ------------------------------------------------------------------------------
def test_cli_show_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_cost.cli.main import main

    db = tmp_path / "audit.db"
    store = AuditStore(f"sqlite:///{db}").ensure_schema()
    history(store, 6)
    still_running(store)
    at = str(NOW)
    assert main(["rightsize", "show", "--db", str(db), "--at", at, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(r["scope"], r["gpus_advice"]) for r in shown["advice_rows"]] == [("class", 1), ("user", 1)]
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_rightsize")[0]["n"] == 0  # show writes nothing
    out = tmp_path / "advice.tsv"
    assert main(["rightsize", "write", "--db", str(db), "--at", at, "--out", str(out), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["file"] == str(out) and out.read_text().startswith(rightsize.FILE_MAGIC)
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_rightsize")[0]["n"] == 2


def test_the_policy_section_has_its_defaults() -> None:
    assert Policy().rightsize == RightsizeConfig()
    assert RightsizeConfig().block is False  # advice only unless a site says otherwise


# -- the weekly report ------------------------------------------------------------------------------
def test_the_weekly_report_counts_how_often_the_advice_was_followed(tmp_path: Path) -> None:
    from gpu_cost.report import kpis
    from gpu_cost.report.render import build_report

    s = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}").ensure_schema()
    since, until = NOW, NOW + 7 * 86400.0
    pol = policy()
    assert kpis.compute(s, pol, since, until)["rightsize_advice"] is None
    history(s, 6)
    still_running(s)
    rightsize.publish(s, pol, NOW, out=tmp_path / "advice.tsv")
    later = NOW + 86400.0
    s.execute("upsert_job_usage", job_rows("f1", gpus=1, needs=[1], start=later, limit=5400.0)
              + job_rows("f2", gpus=8, needs=[1], start=later + H, limit=86400.0))
    adv = kpis.compute(s, pol, since, until)["rightsize_advice"]
    assert (adv["advised_jobs"], adv["followed"], adv["followed_share"]) == (2, 1, 0.5)
    out = build_report(s, pol, since, until, tmp_path / "reports")
    html = Path(out["index"]).read_text(encoding="utf-8")
    assert "Advice at submission (sbatch)" in html and "1 of 2 (50 %)" in html
    assert "alice: asked for more than advised" in html
    md = next(Path(out["index"]).parent.glob("*.md")).read_text(encoding="utf-8")
    assert "**Advice at sbatch:** 1 of 2 jobs it applied to followed it (50 %" in md


def test_the_report_lists_the_same_advice_as_rightsize_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One definition of what a job needed and of the advice (issue 39, row 4): the weekly report's
    right-sizing rows are the rows `gpu-cost rightsize show --all` prints for the same store and instant,
    never a second reckoning (a memory-bound job needed 4 GPUs even where one was busy)."""
    from gpu_cost.cli.main import main
    from gpu_cost.core.timeutil import iso
    from gpu_cost.report import kpis

    db = tmp_path / "audit.db"
    s = AuditStore(f"sqlite:///{db}").ensure_schema()
    # alice asks 8; one GPU busy, but her model fills 4 GPUs' memory: she needed 4
    history(s, 6, needs=[4] * 12)
    rows = []
    for r in s.query("SELECT * FROM gpu_cost_jobs_usage"):
        rows.append({**r, "gpus_busy": 1, "work_gpus": 0.9})
    s.execute("upsert_job_usage", rows)
    still_running(s)
    pol = policy()
    report = kpis.compute(s, pol, NOW - 7 * 86400.0, NOW + 1.0)["right_sizing"]
    assert main(["rightsize", "show", "--all", "--user", "alice", "--db", str(db), "--at", iso(NOW + 1.0),
                 "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["advice_rows"]
    advice = [r for r in shown if r["status"] == "advice"]
    assert advice, shown
    assert sorted((r["user"], r["stem"], r["text"]) for r in report) == sorted(
        (r["user"], r["stem"], r["text"]) for r in advice)
    assert all(r["need"] == 4 and r["suggest"] == 4 and r["requested"] == 8 for r in report), report
