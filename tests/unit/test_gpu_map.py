"""Index truth: the node's numberings (Slurm IDX, NVML index, device minor, UUID) agree or the node is stale."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import GpuProcess, Job, Node
from gpu_cost.perceive import gpu_map
from gpu_cost.perceive.gpu_map import DriverGpu, NodeMap, NvmlGpu, check_node
from gpu_cost.perceive.nodes import parse_inspect

U = [f"GPU-{i}f0e1d2c-3b4a-5968-7071-8293a4b5c6d{i}" for i in range(4)]
BUS = ["0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"]
# nvidia-smi prints an 8-digit domain in upper case
SMI = "".join(f"{i}, {U[i]}, 0000{BUS[i].upper()}\n" for i in range(4))


def driver_info(minor: int, uuid: str, bus: str) -> str:
    # the layout of /proc/driver/nvidia/gpus/<bus>/information (driver 535)
    return (f"Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t 204\nGPU UUID: \t {uuid}\nVideo BIOS: \t 92.00.45.00.06\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")


def good_map() -> NodeMap:
    files = {BUS[i]: driver_info(i, U[i], BUS[i]) for i in range(4)}
    return NodeMap(nvml=gpu_map.parse_map(SMI, "gpu01"), driver=gpu_map.parse_driver_info(files, "gpu01"))


def test_parsers_normalise_bus_ids_and_read_minors() -> None:
    m = good_map()
    assert m.nvml[2] == NvmlGpu(2, U[2], "0000:48:00.0")
    assert m.driver[3] == DriverGpu("0000:4c:00.0", 3, U[3])
    assert gpu_map.bus_id("00000000:3B:00.0") == "0000:3b:00.0"


@pytest.mark.parametrize("line", ["0, not-a-uuid, 0000:07:00.0", "x, GPU-12345678, 0000:07:00.0",
                                  f"0, {U[0]}", f"0, {U[0]}, 07:00"], ids=["uuid", "index", "fields", "bus"])
def test_parse_map_names_the_bad_line(line: str) -> None:
    with pytest.raises(SourceError, match=r"gpu01: GPU numbering line 2"):
        gpu_map.parse_map(f"1, {U[1]}, 0000:0b:00.0\n{line}\n", "gpu01")


def test_agreeing_node_passes_every_check() -> None:
    procs = [GpuProcess(host="gpu01", pid=77, gpu_uuid=U[1], gpu=1, used_mib=10.0, start_ts=1.0, job_id="900")]
    m = good_map()
    m.visible[77] = U[1]
    c = check_node("gpu01", m, slurm_gpus=4, slurm_alloc={"900": [1, 2]}, metric_uuids={0: U[0], 3: U[3]},
                   processes=procs)
    assert c.ok, c.problems
    assert set(c.checked) == {"nvidia-smi", "driver minors", "slurm gres", "metrics uuids", "CUDA_VISIBLE_DEVICES"}


def test_minor_order_differing_from_nvml_order_is_a_disagreement() -> None:
    # the driver numbered the first two GPUs the other way round: /dev/nvidia0 is NVML index 1
    files = {BUS[0]: driver_info(1, U[0], BUS[0]), BUS[1]: driver_info(0, U[1], BUS[1]),
             BUS[2]: driver_info(2, U[2], BUS[2]), BUS[3]: driver_info(3, U[3], BUS[3])}
    m = NodeMap(nvml=gpu_map.parse_map(SMI, "gpu01"), driver=gpu_map.parse_driver_info(files, "gpu01"))
    c = check_node("gpu01", m, slurm_gpus=4)
    assert not c.ok
    assert "/dev/nvidia0 (Slurm IDX 0) is NVML index 1" in c.problems[0]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [({"slurm_gpus": 8}, "Slurm counts 8 GPUs, nvidia-smi shows 4"),
     ({"slurm_alloc": {"900": [3, 5]}}, "job 900 holds IDX [5]"),
     ({"metric_uuids": {0: U[1], 1: U[0]}}, f"the metrics call GPU 0 {U[1]}, nvidia-smi calls it {U[0]}"),
     ({"metric_uuids": {6: U[0]}}, "the metrics have GPU 6"),
     ({"slurm_alloc": {"900": [0]},
       "processes": [GpuProcess(host="gpu01", pid=5, gpu_uuid=U[3], gpu=3, used_mib=1.0, start_ts=1.0, job_id="900")]},
      "process 5 of job 900 runs on GPU 3")],
    ids=["gres-count", "idx-beyond", "metrics-swapped", "metrics-extra", "job-process-elsewhere"],
)
def test_each_disagreement_is_named(kwargs: dict, expected: str) -> None:
    c = check_node("gpu01", good_map(), **kwargs)
    assert not c.ok
    assert any(expected in p for p in c.problems), c.problems


def test_driver_uuid_differing_from_nvidia_smi() -> None:
    files = {BUS[i]: driver_info(i, U[(i + 1) % 4] if i == 2 else U[i], BUS[i]) for i in range(4)}
    m = NodeMap(nvml=gpu_map.parse_map(SMI, "gpu01"), driver=gpu_map.parse_driver_info(files, "gpu01"))
    c = check_node("gpu01", m)
    assert c.problems == (f"GPU 2 at 0000:48:00.0: nvidia-smi says {U[2]}, the driver {U[3]}",)


def test_cuda_visible_devices_by_uuid_maps_to_devices_not_positions() -> None:
    gpus = good_map().nvml
    # the job sees two GPUs, named by UUID (a container or a MIG-less UniqueId setup): devices 3 and 1
    assert gpu_map.visible_devices(f"{U[3]},{U[1]}", gpus) == ((1, 3), ())
    assert gpu_map.visible_devices(U[2][:12], gpus) == ((2,), ())  # a unique prefix, as CUDA accepts
    assert gpu_map.visible_devices("0,1", gpus) is None  # indices: relative to the job's cgroup
    assert gpu_map.visible_devices("MIG-aaaaaaaa-bbbb", gpus) == ((), ())
    assert gpu_map.visible_devices("GPU-deadbeef", gpus) == ((), ("GPU-deadbeef",))
    proc = GpuProcess(host="gpu01", pid=8, gpu_uuid=U[1], gpu=1, used_mib=1.0, start_ts=1.0, job_id="900")
    m = good_map()
    m.visible[8] = f"{U[1]},{U[3]}"
    c = check_node("gpu01", m, slurm_alloc={"900": [0, 1]}, processes=[proc])
    assert any("sees GPUs [1, 3] (by UUID); Slurm gave the job IDX [0, 1]" in p for p in c.problems), c.problems


def test_unreadable_or_unreported_numbering() -> None:
    assert not check_node("gpu01", NodeMap(error="nvidia-smi exited 9")).ok
    unreported = check_node("gpu01", NodeMap(reported=False), slurm_gpus=4)
    assert unreported.ok and "not checked" in unreported.checked[0]
    assert not check_node("gpu01", NodeMap(), slurm_gpus=4).ok


def test_apply_marks_only_the_disagreeing_node_stale() -> None:
    frame = pd.DataFrame({"host": ["gpu01", "gpu01", "gpu02"], "gpu": [0, 1, 0], "uuid": [U[0], U[1], ""],
                          "stale": [False, False, False]})
    hour = pd.DataFrame({"util_max": [0.0, 0.0, 0.0], "stale": [False, False, True]})
    out, windows, problems = gpu_map.apply(frame, [gpu_map.MapCheck("gpu01", ("swapped",)), gpu_map.MapCheck("gpu02")],
                                           {3600.0: hour})
    assert out["stale"].tolist() == [True, True, False]
    # every window a rule reads says it: the node's GPUs stale there too, the others as that window had them
    assert windows[3600.0]["stale"].tolist() == [True, True, True]
    assert frame["stale"].tolist() == [False, False, False] and hour["stale"].tolist() == [False, False, True]
    assert problems == ["gpu index check on gpu01: swapped (its GPUs are treated as stale)"]


def test_snapshot_check_uses_slurm_jobs_nodes_and_metrics() -> None:
    frame = pd.DataFrame({"host": ["gpu01", "gpu01"], "gpu": [0, 1], "uuid": [U[1], U[0]], "stale": [False, False]})
    jobs = [Job(job_id="s0abcdefghjkmn", user="ann", gpu_alloc=(("gpu01", (0,)),))]
    checks = gpu_map.check_snapshot_nodes({"gpu01": good_map()}, frame, jobs,
                                          [Node(name="gpu01", state="mixed", gpus_total=4)], [])
    assert [c.host for c in checks] == ["gpu01"]
    assert any("the metrics call GPU 0" in p for p in checks[0].problems)


def test_inspect_answer_carries_the_numbering() -> None:
    info = {BUS[i]: driver_info(i, U[i], BUS[i]) for i in range(4)}
    answer = {"verb": "inspect", "btime": 1.0, "clk_tck": 100, "gpus": {"rc": 0, "stdout": ""},
              "apps": {"rc": 0, "stdout": ""}, "procs": {"12": {"cuda_visible_devices": U[0]}},
              "map": {"rc": 0, "stdout": SMI}, "driver_gpus": info}
    got = parse_inspect(json.dumps(answer), "gpu01").gpu_map
    assert got.reported and len(got.nvml) == 4 and got.driver[0].minor == 0 and got.visible == {12: U[0]}
    del answer["map"]
    assert parse_inspect(json.dumps(answer), "gpu01").gpu_map.reported is False
    answer["map"] = {"rc": 0, "stdout": "0, GPU-x\n"}
    with pytest.raises(SourceError, match="gpu01: GPU numbering line 1"):
        parse_inspect(json.dumps(answer), "gpu01")


def test_the_nodes_of_idle_looking_jobs_are_checked_too(policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.perceive.live import idle_job_hosts

    frame = pd.DataFrame({"host": ["gpu01", "gpu01", "gpu02", "gpu03"], "gpu": [0, 1, 0, 0],
                          "util_max": [0.0, 1.0, 80.0, 0.0], "stale": [False, False, False, True]})
    jobs = [Job(job_id="1", user="a", gpu_alloc=(("gpu01", (0, 1)),)),  # idle: a cancel could touch gpu01
            Job(job_id="2", user="b", gpu_alloc=(("gpu02", (0,)),)),  # busy
            Job(job_id="3", user="c", gpu_alloc=(("gpu03", (0,)),)),  # stale: never idle
            Job(job_id="4", user="d", state="PENDING")]
    assert idle_job_hosts(frame, jobs, policy) == ["gpu01"]


def test_the_nodes_of_jobs_idle_over_an_idle_rules_own_window_are_checked() -> None:
    """The idle rules judge over their own windows and thresholds, not the zombie rule's (the snapshot's primary
    window): with the zombie window at 30 minutes and the idle-allocation window at 15 (as ``gpu-cost tune`` tries),
    a job idle for the last 15 minutes but busy 20 minutes ago is one the sweep may cancel, and so is a session under
    an idle-interactive threshold above the idle-allocation one. Their nodes' numbering is checked before: read on
    the primary window with the idle-allocation threshold alone, they were not."""
    from gpu_cost.config.loader import parse_policy
    from gpu_cost.perceive.live import idle_job_hosts

    policy = parse_policy("rules: {zombie: {window: 30m}, idle_allocation: {window: 15m},\n"
                          "        idle_interactive: {util_max: 10}}\n", "<test>")
    frame = pd.DataFrame({"host": ["gpu01", "gpu02", "gpu03"], "gpu": [0, 0, 0], "util_max": [40.0, 7.0, 40.0],
                          "stale": [False, False, False]})
    quarter = frame[["util_max", "stale"]].assign(util_max=[0.5, 7.0, 40.0])  # the last 15 minutes
    two_hours = frame[["util_max", "stale"]].assign(util_max=[40.0, 7.0, 40.0])
    jobs = [Job(job_id="1", user="a", gpu_alloc=(("gpu01", (0,)),), batch=True),   # idle for 15 minutes
            Job(job_id="2", user="b", gpu_alloc=(("gpu02", (0,)),), batch=False),  # a session at 7 %
            Job(job_id="3", user="c", gpu_alloc=(("gpu03", (0,)),), batch=True)]   # busy
    assert idle_job_hosts(frame, jobs, policy, {900.0: quarter, 7200.0: two_hours}) == ["gpu01", "gpu02"]


def test_a_job_log_is_never_asked_for_with_a_bad_job_id() -> None:
    from gpu_cost.perceive.nodes import NodeAccess, NodeSource

    asked: list[list[str]] = []

    class Runner:
        def run(self, argv: list[str], timeout: float | None = None) -> None:
            asked.append(argv)
            raise AssertionError("no command may run")

    src = NodeSource(NodeAccess(), runner_for=lambda node: Runner())  # type: ignore[arg-type,return-value]
    got = src.job_log("gpu01", "12;reboot")
    assert "not a Slurm job id" in got["error"] and asked == []


def test_a_mig_node_counts_slices_as_slurm_does() -> None:
    # GPUs 0 and 1 split into seven and two slices, 2 and 3 whole: Slurm's MIG gres counts 7 + 2 + 2 = 11
    m = good_map()
    m.mig_slices.update({0: 7, 1: 2})
    assert m.slurm_devices() == 11
    mig_proc = GpuProcess(host="gpu01", pid=78, gpu_uuid="MIG-5a1c2d3e-0000-5000-8000-000000000001", gpu=0,
                          used_mib=10.0, start_ts=1.0, job_id="901")
    m.visible[78] = mig_proc.gpu_uuid
    ok = check_node("gpu01", m, slurm_gpus=11, slurm_alloc={"901": [9]}, processes=[mig_proc])
    assert ok.ok, ok.problems
    # the same node counted as four whole GPUs, or an IDX past the slices: a disagreement, named
    assert "nvidia-smi shows 11 (MIG slices counted one by one)" in check_node("gpu01", m, slurm_gpus=4).problems[0]
    assert "IDX [11]" in check_node("gpu01", m, slurm_gpus=11, slurm_alloc={"901": [11]}).problems[0]
