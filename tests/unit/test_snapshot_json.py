"""The snapshot the audit store parks for a run's later tasks: what is written is what is read back.

The record classes (jobs, processes, nodes, reservations, findings, decisions) give their fields as
dicts without a deep copy, and the snapshot is written by msgspec as strict JSON: these tests hold
the round trip, the records' dicts against their fields, and the reading of a payload an older
version wrote (``NaN`` where a number was not known).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pandas as pd
import pytest

from gpu_cost.config.loader import load_policy
from gpu_cost.core.model import Decision, Finding, GpuProcess, Job, Node, Reservation, Snapshot
from gpu_cost.loop import sweep
from tests.fixtures.core import NOW

#: the fields each record's to_dict writes in a shape of its own (the rest are its fields as they are)
RESHAPED = {Job: {"gpu_alloc", "nodes", "labels", "mig_alloc", "gpu_shared"}, Node: {"partitions"},
            Reservation: {"nodes", "accounts", "users", "flags"}, GpuProcess: {"mig", "mig_profile", "job_known"},
            Finding: {"gpu_share", "gpu_ids", "labels", "nodes", "evidence"}, Decision: {"evidence"}}


def _no_constants(name: str) -> Any:
    raise AssertionError(f"{name} in the snapshot's JSON: not strict JSON")


@pytest.fixture(scope="module")
def snap() -> Snapshot:
    s = sweep.collect(load_policy(), NOW, "sim")
    assert s.jobs and s.processes and s.nodes and len(s.gpus)
    return s


@pytest.mark.parametrize("hour", [0, 3, 7, 13])
def test_a_simulated_snapshot_reads_back_as_it_was_written(hour: int) -> None:
    s = sweep.collect(load_policy(), NOW + hour * 3600, "sim")
    text = s.to_json()
    back = Snapshot.from_json(text)
    assert (back.ts, back.window_s, back.lookback_s, back.source) == (s.ts, s.window_s, s.lookback_s, s.source)
    assert back.jobs == s.jobs and back.processes == s.processes and back.nodes == s.nodes
    assert back.reservations == s.reservations and back.problems == s.problems
    assert back.classes == s.classes and back.job_logs == s.job_logs
    pd.testing.assert_frame_equal(back.gpus.reset_index(drop=True), s.gpus.reset_index(drop=True), check_dtype=False)
    assert back.windows.keys() == s.windows.keys()
    # and the text is strict JSON: no NaN or Infinity token for another reader to choke on
    json.loads(text, parse_constant=_no_constants)
    assert Snapshot.from_json(back.to_json()).to_json() == back.to_json()
    # the act steps' cluster size, read from the text alone, is the snapshot's
    assert Snapshot.gpu_count_of_json(text) == s.gpu_count() == back.gpu_count() > 0


def test_the_cluster_size_read_from_the_text_counts_slurms_gpus_when_the_metrics_show_fewer(snap: Snapshot) -> None:
    # no metrics at all: the nodes' GPUs (Slurm's GRES) are the size; more GRES than GPU rows: the GRES
    bare = dataclasses.replace(snap, gpus=snap.gpus.iloc[0:0])
    assert Snapshot.gpu_count_of_json(bare.to_json()) == bare.gpu_count() == sum(n.gpus_total for n in snap.nodes) > 0
    few = dataclasses.replace(snap, gpus=snap.gpus.iloc[:3])
    big = tuple(dataclasses.replace(n, gpus_total=0) for n in snap.nodes)
    assert Snapshot.gpu_count_of_json(dataclasses.replace(few, nodes=big).to_json()) == 3
    # an older writer's text (NaN in it) is read whole, with the same answer
    doc = json.loads(snap.to_json())
    doc["nodes"][0]["cpu_util"] = math.nan
    assert Snapshot.gpu_count_of_json(json.dumps(doc)) == snap.gpu_count()


def test_each_records_dict_gives_its_fields_as_they_are(snap: Snapshot) -> None:
    records: list[Any] = [*snap.jobs, *snap.processes, *snap.nodes]
    records.append(Reservation(name="r1", start_ts=NOW, end_ts=NOW + 3600, nodes=("gpu01",), accounts=("nlp",)))
    f = Finding(rule="zombie", target_kind="process", target="proc:gpu01:7:1", action="kill_process", gpus=1,
                gpu_ids=("gpu01:0",), evidence={"nested": {"x": [1, 2]}})
    records += [f, Decision(decision_id="d", ts=NOW, rule="zombie", target_kind="process", target=f.target,
                            action="notify", mode="dry-run", evidence={"nested": {"x": [1]}})]
    for r in records:
        d = r.to_dict()
        for field in dataclasses.fields(r):
            if field.name not in RESHAPED[type(r)]:
                assert d[field.name] == getattr(r, field.name), (type(r).__name__, field.name)
        assert type(r).from_dict(d) == r
    # the evidence is the record's own copy: changing it changes nothing in the record
    d = f.to_dict()
    d["evidence"]["added"] = 1
    assert "added" not in f.evidence


def test_a_number_not_known_is_written_null_and_read_as_none(snap: Snapshot) -> None:
    node = dataclasses.replace(snap.nodes[0], cpu_util=math.nan, power_w=math.inf)
    s = dataclasses.replace(snap, nodes=(node, *snap.nodes[1:]))
    text = s.to_json()
    json.loads(text, parse_constant=_no_constants)
    back = Snapshot.from_json(text).nodes[0]
    assert back.cpu_util is None and back.power_w is None and back.name == node.name


def test_a_payload_an_older_version_wrote_is_read(snap: Snapshot) -> None:
    # what the writer before msgspec stored: the standard library's JSON, NaN for a number not known
    doc = json.loads(snap.to_json())
    doc["nodes"][0]["cpu_util"] = math.nan
    back = Snapshot.from_json(json.dumps(doc, separators=(",", ":")))
    assert back.jobs == snap.jobs and math.isnan(back.nodes[0].cpu_util or 0.0)


def test_the_parked_texts_codec_writes_strict_sorted_json_and_reads_the_old_writers(snap: Snapshot) -> None:
    import numpy as np

    from gpu_cost.core import jsontext

    value = {"b": [1, 2.5, None], "a": {"d": np.int64(3), "c": np.float64(0.25), "e": np.bool_(True)},
             "n": math.nan, "i": -math.inf, "s": "caf\u00e9 \u2713", "t": ("x", 1)}
    text = jsontext.dumps(value, sort_keys=True)
    doc = json.loads(text, parse_constant=_no_constants)
    assert doc == {"a": {"c": 0.25, "d": 3, "e": True}, "b": [1, 2.5, None], "i": None, "n": None,
                   "s": "caf\u00e9 \u2713", "t": ["x", 1]}
    assert list(doc) == sorted(doc) and list(doc["a"]) == sorted(doc["a"])  # a text two writers compare
    assert jsontext.dumps({"b": 1, "a": 2}, sort_keys=True) == jsontext.dumps({"a": 2, "b": 1}, sort_keys=True)
    assert jsontext.loads(text) == doc
    older = json.dumps({"x": math.nan, "y": [1.5]}, sort_keys=True)  # the standard library's, as parked before
    got = jsontext.loads(older)
    assert math.isnan(got["x"]) and got["y"] == [1.5]



def test_a_runs_findings_and_plan_read_back_as_they_were_parked(snap: Snapshot) -> None:
    from gpu_cost.airflow.sweep_tasks import findings_of, findings_text, plan_of, plan_text
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.decide.engine import decide

    policy = load_policy()
    findings = run_rules(snap, policy)
    assert findings
    text = findings_text(findings)
    json.loads(text, parse_constant=_no_constants)
    assert findings_of(text) == findings
    plan = decide(findings, policy, now=snap.ts, escalations={}, total_gpus=len(snap.gpus))
    back = plan_of(plan_text(plan))
    assert back.decisions == plan.decisions and back.openings == plan.openings and back.seen == plan.seen
    assert plan_text(back) == plan_text(plan)
