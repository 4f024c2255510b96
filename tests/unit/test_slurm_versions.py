"""The Slurm parsers on each version's answers: 22.05 (captured) and 23.02 ... 25.11 (constructed from SchedMD's parsers.c).

tests/data/slurm/README.md says how each file was obtained.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.perceive.runner import Completed
from gpu_cost.perceive.slurm import (
    SlurmSource,
    check_job_id,
    openapi_version,
    parse_jobs,
    parse_nodes,
    parse_sacct,
)
from tests.data.slurm.construct import T0, VERSIONS

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
RELEASES = list(VERSIONS)


def load(release: str, name: str) -> dict:
    return json.loads((DATA / release / name).read_text())


@pytest.mark.parametrize("release", RELEASES)
def test_squeue_jobs_of_each_version(release: str) -> None:
    doc = load(release, "squeue.json")
    assert openapi_version(doc) == VERSIONS[release][0]
    jobs = {j.job_id: j for j in parse_jobs(doc)}
    assert sorted(jobs) == ["7001", "7002", "7003_2", "7010"]
    big = jobs["7001"]
    assert (big.user, big.state, big.account, big.partition) == ("alice", "RUNNING", "nlp", "gpu")
    assert big.gpu_alloc == (("gpu01", (0, 1)),)
    assert big.time_limit_s == 7200.0 and big.start_ts == T0 - 3600
    assert big.labels == ("no-interrupt",) and big.priority == 4294901000 and big.batch is True
    # two nodes, one GPU on each, in allocation order
    assert jobs["7002"].gpu_alloc == (("gpu01", (2,)), ("gpu02", (0,)))
    assert jobs["7002"].nodes == ("gpu01", "gpu02") and jobs["7002"].nice == 100
    assert jobs["7003_2"].gpu_alloc == (("gpu02", (3,)),)
    pending = jobs["7010"]
    assert pending.pending and pending.start_ts is None and pending.time_limit_s is None  # infinite
    assert pending.gpus_requested == 4 and pending.gpu_alloc == ()


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", ["nodes.json", "sinfo.json"])
def test_nodes_of_each_version(release: str, name: str) -> None:
    nodes = {n.name: n for n in parse_nodes(load(release, name))}
    assert sorted(nodes) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert nodes["gpu03"].state == "idle~" and nodes["gpu04"].state == "drained"
    assert nodes["gpu01"].state == "mixed" and nodes["gpu01"].gpus_total == 4 and nodes["gpu01"].gpu_model == "a100"
    if name == "nodes.json":  # sinfo groups count GRES in use per group, not per node
        assert (nodes["gpu01"].gpus_alloc, nodes["gpu02"].gpus_alloc, nodes["gpu03"].gpus_alloc) == (3, 2, 0)
        assert nodes["gpu04"].reason == "xid 79"


@pytest.mark.parametrize("release", RELEASES)
def test_sacct_of_each_version(release: str) -> None:
    jobs = {j.job_id: j for j in parse_sacct(load(release, "sacct.json"))}
    assert sorted(jobs) == ["6990", "6991"]
    done = jobs["6990"]
    assert (done.state, done.user, done.gpus_requested, done.time_limit_s) == ("COMPLETED", "alice", 2, 28800.0)
    assert done.end_ts == T0 - 4000 and done.labels == ("inference",)
    assert jobs["6991"].state == "CANCELLED"


def test_the_captured_2205_answers_still_parse() -> None:
    # captured from the real 22.05 cluster (README.md): the oldest shape beside the constructed ones
    doc = json.loads((DATA / "squeue-22.05.json").read_text())
    assert openapi_version(doc) == "v0.0.38"
    assert any(j.gpu_alloc for j in parse_jobs(doc))


def test_a_job_named_only_by_its_sluid_keeps_it_as_text() -> None:
    doc = load("25.11", "squeue.json")
    job = doc["jobs"][0]
    job["job_id"] = 0  # an answer that leaves the number out: the SLUID names the job
    assert parse_jobs(doc)[0].job_id == "s0k2x7d9q4m1ab"
    job["job_id"] = "s0k2x7d9q4m1ab"
    assert parse_jobs(doc)[0].job_id == "s0k2x7d9q4m1ab"
    job["job_id"] = "--uid=0"
    with pytest.raises(SourceError, match=r"jobs\[0\].*not a Slurm job id"):
        parse_jobs(doc)


@pytest.mark.parametrize("good", ["1", "4242", "500_7", "500_[3-9%2]", "77+1", "s0k2x7d9q4m1ab"])
def test_job_ids_slurm_accepts(good: str) -> None:
    assert check_job_id(good) == good


@pytest.mark.parametrize("bad", ["", " ", "-1", "--user=bob", "12 34", "12;ls", "s0k2x7d9q4m1aI", "s0K2X7D9Q4M1AB",
                                 "s123", "1e9", "0x10", "12345678901"],
                         ids=["empty", "space", "negative", "option", "two", "shell", "bad-base32", "upper-case",
                              "short-sluid", "exponent", "hex", "eleven-digits"])
def test_job_ids_that_never_reach_a_command(bad: str) -> None:
    with pytest.raises(SourceError, match="not a Slurm job id"):
        check_job_id(bad)


class Recorder:
    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    def run(self, argv: list[str], timeout: float | None = None, **_: object) -> Completed:
        self.argv.append(list(argv))
        return Completed(list(argv), 0, json.dumps({"jobs": []}), "")


def test_a_bad_job_id_is_refused_before_any_command() -> None:
    rec = Recorder()
    with pytest.raises(SourceError, match="not a Slurm job id"):
        SlurmSource(rec).job("--me")
    assert rec.argv == []
    assert SlurmSource(rec).job("s0k2x7d9q4m1ab") is None
    assert rec.argv == [["squeue", "--json", "--jobs", "s0k2x7d9q4m1ab"]]
