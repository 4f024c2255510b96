"""Slurm's JSON (22.05 captured, 24.05 shape) parsed into Job / Node; hostlists; GPU index strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.perceive.slurm import (
    compress_hostlist,
    expand_hostlist,
    gpu_count_and_model,
    gpu_indices,
    load_json,
    openapi_version,
    parse_jobs,
    parse_nodes,
    parse_sacct,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
NAME = "train; rm -rf / `x` $(y) 'q' \"dq\" ü 日本"


def doc(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu01", ["gpu01"]),
    ("gpu[01-02,05]", ["gpu01", "gpu02", "gpu05"]),
    ("gpu[08-10],login1", ["gpu08", "gpu09", "gpu10", "login1"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("", []), ("None assigned", []), (None, []),
], ids=["single", "ranges", "padding-and-plain", "nested", "empty", "none-assigned", "null"])
def test_expand_hostlist(text, expected) -> None:
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize("bad", ["gpu[01-", "gpu01]", "gpu[a-b]", "gpu[05-01]", "gpu[]"],
                         ids=["open", "close", "letters", "backwards", "empty"])
def test_expand_hostlist_rejects(bad) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(bad)


def test_compress_round_trips() -> None:
    names = ["gpu01", "gpu02", "gpu03", "gpu05", "login"]
    assert compress_hostlist(names) == "login,gpu[01-03,05]"
    assert sorted(expand_hostlist(compress_hostlist(names))) == sorted(names)


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu:a100:2(IDX:0-1)", (0, 1)),
    ("gpu:2(IDX:0,2)", (0, 2)),
    ("gpu:a100:3(IDX:0-1,4)", (0, 1, 4)),
    ("gpu:a100:1(IDX:0),gpu:v100:1(IDX:3)", (0, 3)),
    ("gpu:a100:3(IDX:0-1,4),mps:0", (0, 1, 4)),
    ("gpu:a100:0(IDX:N/A)", ()),
    ("", ()),
], ids=["range", "list", "range-and-list", "two-types", "with-mps", "none", "empty"])
def test_gpu_indices(text, expected) -> None:
    assert gpu_indices(text) == expected


def test_gres_count_and_model() -> None:
    assert gpu_count_and_model("gpu:a100:8(S:0-1)") == (8, "a100")
    assert gpu_count_and_model("gpu:4") == (4, "")
    assert gpu_count_and_model("gpu:a100:4,gpu:h100:2") == (6, "a100")


def test_squeue_2205_captured() -> None:
    d = doc("squeue-22.05.json")
    assert openapi_version(d) == "v0.0.38"
    jobs = {j.job_id: j for j in parse_jobs(d)}
    named = jobs["2"]
    assert named.name == NAME  # metacharacters, quotes, unicode intact
    assert named.state == "RUNNING" and named.running
    assert named.gpu_alloc == (("gpu01", (0, 1)),) and named.gpus_requested == 2
    assert named.labels == ("no-interrupt",) and named.account == "research"
    assert named.time_limit_s == 3600.0 and named.nice == 500 and named.start_ts and named.end_ts is None
    split = jobs["3"]
    assert split.nodes == ("gpu01", "gpu02")
    assert split.gpu_alloc == (("gpu01", (2,)), ("gpu02", (0,)))  # gres_detail is per node, in node order
    pending = jobs["4"]
    assert pending.pending and pending.gpu_alloc == () and pending.nodes == () and pending.gpus_requested == 8
    assert pending.start_ts is None and pending.time_limit_s is None
    assert jobs["1"].state == "COMPLETED" and jobs["1"].end_ts is not None


def test_squeue_2405_shape() -> None:
    d = doc("squeue-24.05.json")
    assert openapi_version(d) == "v0.0.41"
    jobs = {j.job_id: j for j in parse_jobs(d)}
    big = jobs["52001"]
    assert big.state == "RUNNING" and big.time_limit_s == 86400.0 and big.start_ts == 1759992800.0
    assert big.gpu_alloc == (("gpu11", (0, 1, 2, 3)), ("gpu12", (4, 5, 6, 7)))
    assert big.name == 'llm-pretrain "stage 2"; ünïcode ✓' and big.labels == ("no-interrupt",)
    assert jobs["52007_3"].gpu_alloc == (("gpu13", (5,)),)  # array task id from {"set": true, "number": 3}
    waiting = jobs["52020"]
    assert waiting.pending and waiting.qos == "high" and waiting.time_limit_s is None  # infinite → None
    assert waiting.start_ts is None


def test_nodes_both_shapes() -> None:
    old = {n.name: n for n in parse_nodes(doc("sinfo-22.05-powered-down.json"))}
    assert old["gpu02"].state == "idle~" and old["gpu02"].reason == "gpu-cost: off-hours"
    assert old["gpu01"].state == "idle" and old["gpu01"].gpus_total == 4 and old["gpu01"].gpu_model == "a100"
    busy = {n.name: n for n in parse_nodes(doc("sinfo-22.05.json"))}
    assert busy["gpu01"].gpus_alloc == 3 and busy["gpu01"].state == "mixed"
    new = {n.name: n for n in parse_nodes(doc("nodes-24.05.json"), "scontrol show nodes --json")}
    assert new["gpu15"].state == "idle~" and new["gpu16"].state == "drained"
    assert new["gpu11"].gpus_alloc == 8 and new["gpu13"].gpus_alloc == 1 and new["gpu14"].gpus_total == 8


def test_sacct_both_shapes() -> None:
    old = {j.job_id: j for j in parse_sacct(doc("sacct-22.05.json"))}
    assert old["1"].state == "COMPLETED" and old["1"].labels == ("inference",) and old["1"].gpus_requested == 1
    assert old["3"].nodes == ("gpu01", "gpu02") and old["4"].nodes == ()
    new = {j.job_id: j for j in parse_sacct(doc("sacct-24.05.json"))}
    assert new["51990"].state == "COMPLETED" and new["51990"].time_limit_s == 28800.0 and new["51990"].gpus_requested == 4
    assert new["51991"].state == "FAILED" and new["51991"].time_limit_s is None and new["51991"].nodes == ("gpu13", "gpu14")
    assert new["51990"].end_ts - new["51990"].start_ts == 16400.0


@pytest.mark.parametrize(("text", "match"), [
    ("", "printed nothing"),
    ('{"jobs": [{"job_id": 1, "job_state": "RUN', "invalid JSON.*truncated"),
    ("[1, 2]", "JSON list, expected an object"),
    ('{"meta": {}}', "no 'jobs' list"),
    ('{"jobs": {"a": 1}}', "'jobs' is a dict"),
    ('{"jobs": [7]}', r"jobs\[0\] is a int"),
    ('{"jobs": [{"job_state": "RUNNING"}]}', r"jobs\[0\].*job_id is missing"),
    ('{"jobs": [{"job_id": 5, "job_state": 3}]}', r"jobs\[0\].*job_state"),
    ('{"jobs": [{"job_id": 5, "job_state": "RUNNING", "time_limit": "soon"}]}', r"time_limit"),
    ('{"jobs": [{"job_id": 5, "job_state": "RUNNING", "time_limit": {"infinite": false}}]}', "without 'number'"),
    ('{"jobs": [{"job_id": 5, "job_state": "RUNNING", "nodes": "gpu[01-", "gres_detail": ["gpu:1(IDX:0)"]}]}',
     "unbalanced"),
    ('{"jobs": [{"job_id": 5, "job_state": "RUNNING", "nodes": "gpu01", "gres_detail": ["gpu:1(IDX:0-x)"]}]}',
     r"jobs\[0\]"),
    ('{"errors": [{"description": "Unable to contact slurm controller"}], "jobs": []}', "reported an error"),
], ids=["empty", "truncated", "list", "no-jobs", "jobs-not-list", "job-not-object", "no-id", "bad-state",
        "bad-number", "bad-number-object", "bad-hostlist", "bad-idx", "errors"])
def test_malformed_answers_raise_source_error(text, match) -> None:
    with pytest.raises(SourceError, match=match) as info:
        parse_jobs(load_json(text, "squeue --json"), "squeue --json")
    assert "squeue --json" in str(info.value)


def test_malformed_nodes_and_sacct() -> None:
    with pytest.raises(SourceError, match=r"sinfo --json.*nodes\[0\].*state"):
        parse_nodes({"nodes": [{"name": "gpu01", "state": None}]}, "sinfo --json")
    with pytest.raises(SourceError, match=r"sacct --json.*state is not an object"):
        parse_sacct({"jobs": [{"job_id": 1, "state": "COMPLETED"}]}, "sacct --json")
