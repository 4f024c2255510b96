"""MIG slices, multi-node jobs and shared GPUs: attributed as devices, judged over all a job's GPUs,
and never acted on by a utilisation that is not the job's own (``include/scenarios/modern.yaml``)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from gpu_cost.analyse.rules import run_rules
from gpu_cost.config.loader import parse_policy
from gpu_cost.core.model import Finding, GpuProcess, Job, device_id, mig_share
from gpu_cost.decide.engine import decide, guard
from gpu_cost.sim import cluster as sim
from tests.fixtures.core import NOW, ROOT


@pytest.fixture(scope="module")
def modern():  # type: ignore[no-untyped-def]
    sc = sim.load_scenario(ROOT / "include" / "scenarios" / "modern.yaml")
    return dataclasses.replace(sc, anchor=NOW)


@pytest.fixture(scope="module")
def snap(modern):  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import load_policy

    return sim.snapshot(load_policy(ROOT / "include" / "policy" / "default.yaml"), NOW, modern)


@pytest.fixture(scope="module")
def found(snap):  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import load_policy

    return {(f.rule, f.target): f for f in run_rules(snap, load_policy(ROOT / "include" / "policy" / "default.yaml"))}


@pytest.mark.parametrize(
    ("profile", "parent_gb", "sevenths"),
    [("1g.10gb", 80, 1), ("2g.20gb", 80, 2), ("3g.40gb", 80, 3), ("4g.40gb", 80, 4), ("7g.80gb", 80, 7),
     ("1g.20gb", 80, 2), ("1g.10gb+me", 80, 1), ("1g.5gb", 40, 1), ("3g.20gb", 40, 3), ("1g.12gb", 94, 1),
     ("1g.24gb", 94, 2), ("3g.47gb", 94, 3), ("1g.18gb", 141, 1), ("1g.35gb", 141, 2), ("1g.20gb", None, 1)],
    ids=lambda v: str(v),
)
def test_a_slice_costs_its_share_of_the_gpu(profile: str, parent_gb: float | None, sevenths: int) -> None:
    assert mig_share(profile, parent_gb) == pytest.approx(sevenths / 7)


def test_a_name_that_is_no_profile_is_an_error() -> None:
    with pytest.raises(ValueError, match="'a100' is not a MIG profile"):
        mig_share("a100")


def test_slices_are_devices_of_their_own(snap) -> None:  # type: ignore[no-untyped-def]
    g = snap.gpus
    sl = g[g["mig"] != ""].set_index(["host", "gpu", "mig"])
    assert list(sl.index) == [("gpu01", 0, "1"), ("gpu01", 0, "2"), ("gpu01", 0, "3"), ("gpu01", 1, "1"),
                              ("gpu01", 1, "2"), ("gpu01", 1, "3")]
    assert sl.loc[("gpu01", 0, "3"), "mig_profile"] == "1g.10gb"
    assert sl.loc[("gpu01", 0, "3"), "share"] == pytest.approx(1 / 7)
    assert sl.loc[("gpu01", 0, "3"), "mem_total_mib"] == 10240
    assert sl["uuid"].nunique() == 2 and sl["mig_uuid"].str.startswith("MIG-").all()
    # one slice busy, the next idle: utilisation is per slice
    assert sl.loc[("gpu01", 0, "1"), "util_max"] > 50 and sl.loc[("gpu01", 0, "3"), "util_max"] < 1
    assert sl.loc[("gpu01", 0, "1"), "job_id"] == "2001" and sl.loc[("gpu01", 0, "3"), "attribution"] == "none"
    assert sl["power_w"].isna().all(), "no exporter measures a slice's own power"
    whole = g[g["mig"] == ""]
    assert (whole["share"] == 1.0).all() and len(whole) == 24 - 2


def test_a_zombie_on_a_slice_is_only_that_slice(found) -> None:  # type: ignore[no-untyped-def]
    zombies = [f for (rule, _), f in found.items() if rule == "zombie"]
    assert len(zombies) == 1
    z = zombies[0]
    assert z.target == f"proc:gpu01:{sim.sim_pid('2002')}:{int(NOW - 4 * 3600)}" and z.action == "kill_process"
    assert z.gpu_ids == ("gpu01:0/mig3",) and z.gpu_share == pytest.approx(1 / 7, abs=1e-4)
    assert z.evidence["mig_profile"] == "1g.10gb" and z.evidence["gpu_uuid"].startswith("MIG-")
    assert z.evidence["process_name"] == "python" and z.user == "bob"


def test_an_idle_slice_is_costed_by_its_share(found) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.decide.cost import stakes

    f = found[("idle_allocation", "job:2003")]
    assert f.action == "cancel" and f.gpus == 1 and f.gpu_ids == ("gpu01:1/mig3",)
    assert f.gpu_share == pytest.approx(1 / 7, abs=1e-4) and f.evidence["mig_profiles"] == ["1g.10gb"]
    st = stakes(f, NOW)
    assert st.at_risk == pytest.approx(3 * f.gpu_share)  # 3 h run on a seventh of a GPU
    whole = dataclasses.replace(f, gpu_share=None)
    assert stakes(whole, NOW).at_risk == pytest.approx(3.0)


def test_a_multi_node_job_is_judged_over_all_its_gpus(found) -> None:  # type: ignore[no-untyped-def]
    f = found[("idle_allocation", "job:2004")]
    assert f.gpus == 8 and f.host is None and f.nodes == ("gpu02", "gpu03")
    assert f.evidence["per_node"] == {"gpu02": {"gpus": 4, "idle": 4}, "gpu03": {"gpus": 4, "idle": 4}}
    assert ("partly_idle", "job:2004") not in found, "all idle is idle_allocation's"


def test_a_partly_idle_job_gets_right_sizing_advice(found) -> None:  # type: ignore[no-untyped-def]
    f = found[("partly_idle", "job:2005")]
    assert f.action == "advise" and f.gpus == 6
    ev = f.evidence
    assert (ev["idle_gpus"], ev["gpus"], ev["suggested_gpus"]) == (6, 8, 2)
    assert ev["per_node"] == {"gpu01": {"gpus": 4, "idle": 4}, "gpu02": {"gpus": 4, "idle": 2}}
    assert ev["idle_gpu_ids"] == ["gpu01:4", "gpu01:5", "gpu01:6", "gpu01:7", "gpu02:6", "gpu02:7"]
    assert ("idle_allocation", "job:2005") not in found


def test_a_shared_gpu_never_acts_on_one_job(found, snap, modern) -> None:  # type: ignore[no-untyped-def]
    row = snap.gpus.set_index(["host", "gpu"]).loc[("gpu03", 0)]
    assert row["attribution"] == "shared" and row["job_id"] is None and row["sharers"] == "2006,2007"
    for jid, other in (("2006", "2007"), ("2007", "2006")):
        f = found[("idle_allocation", f"job:{jid}")]
        assert f.action == "advise" and f.evidence["shared"] == {"gpu03:0": ["2006", "2007"]}
        assert f"shared with other jobs ({other})" in f.evidence["refused"]
    # while both worked, each job's process was its own, with its part of the device's memory
    cluster = sim.SimCluster(modern, anchor=NOW)
    t = NOW - 115 * 60
    procs = {p.job_id: p for p in cluster.processes_at(t) if p.host == "gpu03" and p.gpu == 0}
    assert set(procs) == {"2006", "2007"} and procs["2006"].pid != procs["2007"].pid
    m = cluster.matrix(t - 60, t)
    row = next(i for i in range(len(m.hosts)) if m.hosts[i] == "gpu03" and m.gpus[i] == 0)
    assert procs["2006"].used_mib + procs["2007"].used_mib == pytest.approx(m.mem[row, -1], abs=0.2)


def test_the_engine_refuses_to_act_on_a_shared_gpus_job(found) -> None:  # type: ignore[no-untyped-def]
    policy = parse_policy("version: 1\nmode: enforce\n", "<t>")
    f = found[("idle_allocation", "job:2006")]
    forced = dataclasses.replace(f, action="cancel")  # as if a rule had asked for more
    plan = decide([forced], policy, now=NOW, escalations={})
    assert [d.action for d in plan.decisions] == ["advise"]
    v = guard(forced, "cancel", policy, now=NOW)
    assert v.action == "none" and v.refusal and "shared with other jobs" in v.refusal
    # the same finding without a sharer is acted on: the refusal is the sharing's
    alone = dataclasses.replace(forced, evidence={k: v for k, v in f.evidence.items() if k not in ("shared", "refused")})
    assert guard(alone, "cancel", policy, now=NOW).action == "cancel"


def test_partly_idle_is_advice_only(found) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.core.errors import PolicyError

    with pytest.raises(PolicyError, match=r"rules.partly_idle.ladder\[0\].action: 'cancel' is not possible"):
        parse_policy("version: 1\nrules:\n  partly_idle:\n    ladder: [{action: cancel}]\n", "<t>")
    policy = parse_policy("version: 1\nmode: enforce\n", "<t>")
    f = found[("partly_idle", "job:2005")]
    assert [(d.action, d.mode) for d in decide([f], policy, now=NOW, escalations={}).decisions] == [("advise", "enforce")]
    escalated = {("partly_idle", f.target, "live"): {"state": "open", "episode": 1, "rung": 0, "first_seen": NOW - 86400}}
    plan = decide([f], policy, now=NOW, escalations=escalated)
    assert not plan.decisions and plan.waiting[0]["why"] == "ladder complete"


def test_records_of_whole_gpus_read_as_before() -> None:
    j = Job("1", "u", gpu_alloc=(("g1", (0,)),))
    assert "mig_alloc" not in j.to_dict() and "gpu_shared" not in j.to_dict()
    p = GpuProcess("g1", 42, gpu_uuid="GPU-1", gpu=0)
    assert "mig" not in p.to_dict() and "mig_profile" not in p.to_dict()
    f = Finding("zombie", "gpu", "gpu:g1:0", "notify", 1)
    assert "gpu_share" not in f.to_dict() and f.gpu_equivalents == 1.0
    m = Job("2", "u", gpu_alloc=(("g1", (0, 0)),), mig_alloc=(("g1", ("0/1", "MIG-abc")),), gpu_shared=True)
    back = Job.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m and back.mig_keys() == [("g1", "0/1"), ("g1", "MIG-abc")]
    q = GpuProcess("g1", 43, gpu_uuid="MIG-abc", gpu=0, mig="1", mig_profile="1g.10gb")
    assert GpuProcess.from_dict(q.to_dict()) == q
    assert device_id("g1", 0) == "g1:0" and device_id("g1", 0, "3") == "g1:0/mig3"


def test_a_whole_gpu_cluster_gives_the_frame_it_always_gave(policy) -> None:  # type: ignore[no-untyped-def]
    snap = sim.snapshot(policy, NOW, dataclasses.replace(sim.load_scenario(), anchor=NOW))
    assert not {"mig", "mig_profile", "mig_uuid", "share", "sharers"} & set(snap.gpus.columns)
    assert '"mig' not in snap.to_json() and "gpu_shared" not in snap.to_json()


def test_slices_joined_to_nvidia_smi_by_profile_only_when_unique() -> None:
    import pandas as pd

    from gpu_cost.perceive.correlate import join_mig_uuids

    g = pd.DataFrame({"host": ["h"] * 4, "gpu": [0, 0, 0, 1], "mig": ["1", "2", "3", "1"],
                      "mig_profile": ["3g.40gb", "1g.10gb", "1g.10gb", "7g.80gb"], "mig_uuid": [""] * 4})
    procs = [GpuProcess("h", 1, gpu_uuid="MIG-a", gpu=0, mig_profile="3g.40gb"),
             GpuProcess("h", 2, gpu_uuid="MIG-b", gpu=0, mig_profile="1g.10gb"),
             GpuProcess("h", 3, gpu_uuid="MIG-c", gpu=1, mig_profile="7g.80gb")]
    out = join_mig_uuids(g, procs)
    # two 1g.10gb slices on GPU 0: which one MIG-b is cannot be told, so neither is joined
    assert out["mig_uuid"].tolist() == ["MIG-a", "", "", "MIG-c"]


def test_slices_joined_exactly_by_instance_id_when_the_node_reports_it() -> None:
    import pandas as pd

    from gpu_cost.perceive.correlate import join_mig_uuids

    g = pd.DataFrame({"host": ["h"] * 3, "gpu": [0, 0, 0], "mig": ["9", "10", "11"],
                      "mig_profile": ["1g.10gb"] * 3, "mig_uuid": [""] * 3})
    procs = [GpuProcess("h", 1, gpu_uuid="MIG-a", gpu=0, mig="9", mig_profile="1g.10gb"),
             GpuProcess("h", 2, gpu_uuid="MIG-b", gpu=0, mig="11", mig_profile="1g.10gb")]
    assert join_mig_uuids(g, procs)["mig_uuid"].tolist() == ["MIG-a", "", "MIG-b"]


def _fake_nvidia_smi():  # type: ignore[no-untyped-def]
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("fake_nvidia_smi", str(ROOT / "include" / "sim" / "nvidia-smi"))
    spec = importlib.util.spec_from_loader("fake_nvidia_smi", loader)
    assert spec is not None
    smi = importlib.util.module_from_spec(spec)
    loader.exec_module(smi)
    return smi


def _inspect(smi, state: dict, host: str, *, instances: bool = True):  # type: ignore[no-untyped-def]
    """What the node wrapper's ``inspect`` answers for a fake nvidia-smi state (``instances``: a newer wrapper)."""
    def out(*argv: str) -> dict:
        rc, stdout, stderr = smi.render(list(argv), json.loads(json.dumps(state)))
        return {"rc": rc, "stdout": stdout, "stderr": stderr}

    stat = "{} (python) S " + " ".join(["0"] * 18) + " 100 0 0"
    answer = {"verb": "inspect", "btime": NOW - 86400, "clk_tck": 100,
              "gpus": out("--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu",
                          "--format=csv,noheader,nounits"),
              "apps": out("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"),
              "list": out("-L"), "map": out("--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"),
              "procs": {str(p["pid"]): {"stat": stat.format(p["pid"]), "cgroup": p.get("cgroup", ""), "user": "bob"}
                        for p in state["processes"]}}
    if instances:
        answer["mig_query"] = out("-q")
    return json.dumps(answer)


@pytest.mark.parametrize("instances", [True, False], ids=["instance-ids", "older-wrapper"])
def test_seven_same_profile_slices_only_the_zombies_slice_is_found(policy, instances: bool) -> None:  # type: ignore[no-untyped-def]
    """Seven 1g.10gb slices (GI 8..14) on one GPU: a zombie on GI 9, a running job's process on GI 10."""
    import numpy as np

    from gpu_cost.perceive.nodes import parse_inspect
    from gpu_cost.perceive.snapshot import from_matrix

    gis = list(range(8, 15))
    parent = "GPU-00000000-0000-4000-8000-000000000000"
    slices = [{"gi": gi, "profile": "1g.10gb", "uuid": f"MIG-00000000-0000-4000-8000-0000000000{gi:02d}",
               "memory_total": 9728, "memory_used": 2048} for gi in gis]
    state = {"gpus": [{"index": 0, "uuid": parent, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920,
                       "memory_used": 4096, "utilization": None, "mig": slices}],
             "processes": [{"pid": 4101, "gpu_uuid": slices[1]["uuid"], "used_mib": 2048},
                           {"pid": 4102, "gpu_uuid": slices[2]["uuid"], "used_mib": 2048,
                            "cgroup": "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"}]}
    seen = parse_inspect(_inspect(_fake_nvidia_smi(), state, "gpu01", instances=instances), "gpu01")
    by_pid = {p.pid: p for p in seen.processes}
    assert (by_pid[4101].mig, by_pid[4102].mig) == (("9", "10") if instances else ("", ""))
    assert by_pid[4102].job_id == "4242"

    step = policy.sweep.sample_interval
    times = np.arange(NOW - policy.sweep.lookback + step, NOW + 1, step)
    n, k = len(times), len(gis)
    job = Job("4242", "bob", state="RUNNING", start_ts=NOW - 7200, nodes=("gpu01",), gpu_alloc=(("gpu01", (0,)),))
    snap = from_matrix(
        policy=policy, now=NOW, source="test", hosts=np.array(["gpu01"] * k, dtype=object), gpus=np.zeros(k, int),
        uuids=np.array([parent] * k, dtype=object), models=np.array(["a100"] * k, dtype=object),
        mem_total=np.full(k, 9728.0), times=times, util=np.zeros((k, n)), mem=np.full((k, n), 2048.0),
        power=np.full((k, n), 60.0), job=np.full((k, n), "", dtype=object), jobs=[job], processes=seen.processes,
        nodes=[], mig={"mig": np.array([str(g) for g in gis], dtype=object),
                       "mig_profile": np.array(["1g.10gb"] * k, dtype=object),
                       "mig_uuid": np.array([""] * k, dtype=object), "share": np.full(k, 1 / 7)})
    zombies = [f for f in run_rules(snap, policy) if f.rule == "zombie"]
    if not instances:
        # by profile alone none of seven alike slices can be told apart: no data, no action
        assert zombies == []
        return
    assert [(f.evidence["pid"], f.gpu_ids) for f in zombies] == [(4101, ("gpu01:0/mig9",))]
    assert zombies[0].evidence["gpu_uuid"] == slices[1]["uuid"]
    rows = snap.gpus.set_index("mig")
    assert rows.loc["10", "job_id"] == "4242" and rows.loc["10", "attribution"] == "cgroup"
    assert rows.loc["9", "mig_uuid"] == slices[1]["uuid"]


def test_the_exporter_labels_slices_as_dcgm_exporter_does(modern) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.sim.exporter import ScenarioFeed, exposition

    text = exposition(ScenarioFeed(modern, started=NOW), NOW)
    slice_lines = [ln for ln in text.splitlines() if 'GPU_I_ID="' in ln]
    assert slice_lines and all('GPU_I_PROFILE="' in ln for ln in slice_lines)
    engine = [ln for ln in slice_lines if ln.startswith("DCGM_FI_PROF_GR_ENGINE_ACTIVE{")]
    assert len(engine) == 6
    assert not [ln for ln in slice_lines if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")], \
        "device utilisation is not valid on a slice"
    one = next(ln for ln in engine if 'GPU_I_ID="3"' in ln and 'gpu="0"' in ln)
    assert 'GPU_I_PROFILE="1g.10gb"' in one and f'UUID="{sim.gpu_uuid("gpu01", 0)}"' in one
    assert len([ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]) == 24 - 2


def test_fake_nvidia_smi_lists_slices_and_the_node_source_reads_them(modern) -> None:  # type: ignore[no-untyped-def]
    import importlib.machinery
    import importlib.util

    from gpu_cost.perceive.nodes import parse_inspect
    from gpu_cost.sim.exporter import nvidia_smi_state

    loader = importlib.machinery.SourceFileLoader("fake_nvidia_smi", str(ROOT / "include" / "sim" / "nvidia-smi"))
    spec = importlib.util.spec_from_loader("fake_nvidia_smi", loader)
    assert spec is not None
    smi = importlib.util.module_from_spec(spec)
    loader.exec_module(smi)
    cluster = sim.SimCluster(modern, anchor=NOW)
    state = nvidia_smi_state(cluster, "gpu01", NOW)
    rc, listing, _ = smi.render(["-L"], state)
    assert rc == 0
    lines = listing.splitlines()
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {sim.gpu_uuid('gpu01', 0)})"
    assert re.fullmatch(r"  MIG 3g\.40gb     Device  0: \(UUID: MIG-[0-9a-f-]{36}\)", lines[1]), lines[1]
    assert lines[4].startswith("GPU 1: ")
    _, gpus, _ = smi.render(["--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu",
                             "--format=csv,noheader,nounits"], state)
    assert gpus.splitlines()[0].endswith(", [N/A]"), "a MIG GPU's utilisation is N/A"
    _, apps, _ = smi.render(["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"], state)
    stat = "{} (python) S " + " ".join(["0"] * 18) + " 100 0 0"
    inspect = {"verb": "inspect", "btime": NOW - 86400, "clk_tck": 100,
               "gpus": {"rc": 0, "stdout": gpus}, "apps": {"rc": 0, "stdout": apps}, "list": {"rc": 0, "stdout": listing},
               "procs": {str(p["pid"]): {"stat": stat.format(p["pid"]), "cgroup": "", "user": "bob"}
                         for p in state["processes"]}, "mig_query": {"rc": 0, "stdout": smi.render(["-q"], state)[1]}}
    seen = parse_inspect(json.dumps(inspect), "gpu01")
    zombie = next(p for p in seen.processes if p.pid == sim.sim_pid("2002"))
    assert zombie.gpu == 0 and zombie.gpu_uuid.startswith("MIG-") and zombie.mig_profile == "1g.10gb"
    # the fake's -q gives each slice the GPU instance id the simulator (and so the metrics) key it by
    assert zombie.mig and zombie.mig == next(p.mig for p in cluster.processes_at(NOW) if p.pid == zombie.pid)
    assert {d.profile for d in seen.mig.values()} == {"3g.40gb", "2g.20gb", "1g.10gb", "4g.40gb"}


def test_the_modern_scenario_round_trips(modern) -> None:  # type: ignore[no-untyped-def]
    back = sim.scenario_from_dict(sim.scenario_to_dict(modern), modern.source)
    assert back.nodes == modern.nodes and back.jobs == modern.jobs


@pytest.mark.parametrize(
    ("node", "job", "error"),
    [({"mig": {0: ["4g.40gb", "4g.40gb"]}}, None, r"nodes\[0\]: mig\[0\]: slices .* do not fit one GPU"),
     ({"mig": {0: ["9g.1gb"]}}, None, r"nodes\[0\]: mig\[0\]: '9g.1gb' is not a MIG profile"),
     ({"mig": {0: ["1g.10gb"]}}, {"gpus": [0]}, r"jobs\[0\]: gpus \[0\] do not fit .* held by its slices"),
     ({"mig": {0: ["1g.10gb"]}}, {"mig": ["0/2"]}, r"jobs\[0\]: MIG slice '0/2' is not a slice of node g"),
     ({}, {"gpus": [0], "also": {"h": [0]}}, r"jobs\[0\]: also: node 'h' is not a node of the scenario")],
    ids=["too-many-slices", "bad-profile", "whole-gpu-of-a-mig-gpu", "no-such-slice", "unknown-other-node"],
)
def test_scenario_errors_name_the_entry(node: dict, job: dict | None, error: str) -> None:
    from gpu_cost.core.errors import ScenarioError

    jobs = [] if job is None else [{"job_id": "1", "user": "u", "behaviour": "idle", "node": "g", "start": "-1h", **job}]
    with pytest.raises(ScenarioError, match=error):
        sim.scenario_from_dict({"nodes": [{"name": "g", "gpus": 2, **node}], "jobs": jobs})


def test_traces_carry_multi_node_jobs_and_refuse_mig(modern, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd

    from gpu_cost.cli.commands.simtrace import write_scenario_trace
    from gpu_cost.core.errors import GpuCostError

    with pytest.raises(GpuCostError, match="a scenario with MIG slices cannot be written as a trace"):
        write_scenario_trace(tmp_path / "mig", modern, NOW - 3600, NOW, fmt="csv")
    whole = dataclasses.replace(modern, nodes=tuple(dataclasses.replace(n, mig=()) for n in modern.nodes),
                                jobs=tuple(j for j in modern.jobs if not j.mig))
    write_scenario_trace(tmp_path / "t", whole, NOW - 3600, NOW, fmt="csv")
    samples = pd.read_csv(tmp_path / "t" / "samples.csv")
    jobs = pd.read_csv(tmp_path / "t" / "jobs.csv", dtype={"job_id": str}).set_index("job_id")
    assert jobs.loc["2004", "gpus"] == 8 and jobs.loc["2004", "nodes"] == "gpu02,gpu03"
    on_second = samples[(samples["host"] == "gpu01") & (samples["gpu"] == 5)]  # job 2005's second node
    assert (on_second["pid"] == sim.sim_pid("2005")).all(), "the second node's GPUs carry the job's process too"
