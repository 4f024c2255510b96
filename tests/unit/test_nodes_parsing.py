"""Node source parsers, from nvidia-smi and /proc output in their documented real formats."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.perceive.nodes import (
    container_from_cgroup,
    container_of,
    job_from_cgroup,
    parse_apps,
    parse_gpus,
    parse_inspect,
    start_ticks,
)
from tests.fixtures.core import ROOT

DATA = ROOT / "tests" / "data" / "nvidia-smi"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_query_gpu_with_and_without_units() -> None:
    plain = parse_gpus(text("query-gpu.csv"), "gpu01")
    assert [g.index for g in plain] == [0, 1, 2, 3]
    assert plain[0].uuid == "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763" and plain[0].memory_used_mib == 71234
    assert plain[3].memory_used_mib is None and plain[3].util is None  # [N/A]
    units = parse_gpus(text("query-gpu-units.csv"), "gpu01")
    assert [(g.index, g.memory_used_mib, g.util) for g in units] == [(0, 71234, 97), (1, 36864, 0)]


def test_compute_apps() -> None:
    assert parse_apps(text("query-compute-apps.csv"), "gpu01") == [
        (48213, "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763", 71230.0),
        (50117, "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418", 36860.0),
        (50117, "GPU-c07eb90d-74b0-d3b4-e6ce-f18687564243", 0.0),
    ]
    assert parse_apps("", "gpu01") == []


def test_parse_errors_name_host_and_line() -> None:
    with pytest.raises(SourceError, match=r"gpu07: nvidia-smi --query-compute-apps line 2: expected 3 fields"):
        parse_apps(text("query-compute-apps-bad.csv"), "gpu07")
    with pytest.raises(SourceError, match=r"gpu07: nvidia-smi --query-gpu line 1: 'lots' is not a number"):
        parse_gpus("0, GPU-x, A100, lots, 1, 2\n", "gpu07")


def test_stat_start_time_with_parentheses_in_the_name() -> None:
    assert start_ticks(text("proc-stat.txt")) == 123456789
    with pytest.raises(SourceError, match="not a stat line"):
        start_ticks("garbage", "gpu01", 5)


@pytest.mark.parametrize(
    ("name", "job", "container"),
    [("cgroup-slurm-v2.txt", "81234", None), ("cgroup-slurm-v1.txt", "81235", None),
     ("cgroup-docker.txt", None, "4f6c3a1be2d9"), ("cgroup-k8s.txt", None, "9d8c7b6a5f4e"), ("cgroup-user.txt", None, None)],
    ids=["slurm-v2", "slurm-v1", "docker", "kubernetes", "user-session"],
)
def test_cgroup_attribution(name: str, job: str | None, container: str | None) -> None:
    assert job_from_cgroup(text(name)) == job
    assert container_from_cgroup(text(name)) == container


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [(text("cgroup-docker.txt"), ("docker", "4f6c3a1be2d9")), (text("cgroup-k8s.txt"), ("kubepods", "9d8c7b6a5f4e")),
     ("0::/machine.slice/libpod-" + "ab" * 32 + ".scope\n", ("podman", "abababababab")),
     ("0::/system.slice/cri-containerd-" + "cd" * 32 + ".scope\n", ("containerd", "cdcdcdcdcdcd")),
     (text("cgroup-user.txt"), None), (text("cgroup-slurm-v2.txt"), None)],
    ids=["docker", "kubernetes-pod", "podman", "containerd", "user-session", "slurm"],
)
def test_container_runtime_from_cgroup(cgroup: str, expected: tuple[str, str] | None) -> None:
    assert container_of(cgroup) == expected


def test_inspect_attributes_processes() -> None:
    stat = text("proc-stat.txt")
    doc = {
        "verb": "inspect", "btime": 1700000000, "clk_tck": 100,
        "gpus": {"rc": 0, "stdout": text("query-gpu.csv"), "stderr": ""},
        "apps": {"rc": 0, "stdout": text("query-compute-apps.csv"), "stderr": ""},
        "procs": {"48213": {"stat": stat, "cgroup": text("cgroup-user.txt"), "user": "bob", "slurm_job_id": None},
                  "50117": {"stat": stat, "cgroup": text("cgroup-slurm-v2.txt"), "user": "eve", "slurm_job_id": "1"}},
    }
    got = parse_inspect(json.dumps(doc), "gpu01")
    assert len(got.gpus) == 4
    orphan, *job_procs = got.processes
    assert (orphan.pid, orphan.job_id, orphan.user, orphan.gpu, orphan.start_ts) == (48213, None, "bob", 0, 1701234567.0)
    assert orphan.name == "python3 (train) x"
    assert [(p.job_id, p.gpu) for p in job_procs] == [("81234", 1), ("81234", 2)]  # cgroup wins over the environment
    doc["procs"]["48213"]["cgroup"] = text("cgroup-docker.txt")  # type: ignore[index]
    assert parse_inspect(json.dumps(doc), "gpu01").processes[0].container == "docker:4f6c3a1be2d9"
    doc["apps"] = {"rc": 9, "stdout": "", "stderr": "NVIDIA-SMI has failed"}
    with pytest.raises(SourceError, match="gpu01: nvidia-smi failed"):
        parse_inspect(json.dumps(doc), "gpu01")
    with pytest.raises(SourceError, match="gpu01: inspect did not answer JSON"):
        parse_inspect("Permission denied", "gpu01")


def _fake_smi(tmp_path, state: dict, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    (tmp_path / "state.json").write_text(json.dumps(state))
    return subprocess.run([sys.executable, str(ROOT / "include" / "sim" / "nvidia-smi"), *args], capture_output=True,
                          text=True, env={"GPU_COST_SIM_NVIDIA_SMI_STATE": str(tmp_path / "state.json")})


def test_fake_nvidia_smi_prints_the_real_formats(tmp_path) -> None:  # type: ignore[no-untyped-def]
    gpus = [{"index": i, "uuid": u, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": m,
             "utilization": ut} for i, (u, m, ut) in enumerate([("GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763", 71234, 97),
                                                                ("GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418", 36864, 0)])]
    state: dict[str, object] = {"gpus": gpus, "processes": [{"pid": 48213, "gpu_uuid": gpus[0]["uuid"], "used_mib": 71230}]}
    plain = _fake_smi(tmp_path, state, "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu",
                      "--format=csv,noheader,nounits")
    assert plain.stdout == text("query-gpu.csv").split("2, GPU")[0]
    units = _fake_smi(tmp_path, state, "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu", "--format=csv")
    assert units.stdout == text("query-gpu-units.csv")
    apps = _fake_smi(tmp_path, state, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits")
    assert apps.stdout == text("query-compute-apps.csv").splitlines(keepends=True)[0]
    assert parse_apps(apps.stdout, "n") == [(48213, gpus[0]["uuid"], 71230.0)]
    bad = _fake_smi(tmp_path, state, "--query-gpu=index,flux", "--format=csv")
    assert bad.returncode == 2 and 'Field "flux" is not a valid field to query.' in bad.stderr
    state["check_pids"] = True  # pid 48213 does not exist here: nvidia-smi would not list it
    assert _fake_smi(tmp_path, state, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader").stdout == ""


# -- MIG: each slice's GPU instance id ----------------------------------------------------------
# ``nvidia-smi -q`` lists a MIG GPU's slices under "MIG Devices", each "MIG Device" with its Index
# (the "Device N" of ``nvidia-smi -L``), GPU Instance ID and Compute Instance ID: the text form of
# ``-q -x``'s <mig_devices><mig_device><index/><gpu_instance_id/><compute_instance_id/> (as in
# ceems-dev/ceems's collector tests), values in the column ``-q`` aligns them to. Seven 1g slices
# of one A100 get GPU instance ids 7, 8, 9, 11, 12, 13, 14 (``nvidia-smi mig -cgi 19,19,19,19,19,19,19``
# as shown in rapidsai/dask-cuda#583), so the id is not the device index.
SEVEN_GI = (7, 8, 9, 11, 12, 13, 14)
MIG_QUERY = "\n==============NVSMI LOG==============\n\n" + "".join(
    f"GPU 00000000:{bus}:00.0\n    MIG Mode\n        Current                           : {mode}\n"
    + ("    MIG Devices                           : None\n" if mode == "Disabled" else "    MIG Devices\n" + "".join(
        f"        MIG Device\n            Index                         : {k}\n"
        f"            GPU Instance ID               : {gi}\n            Compute Instance ID           : 0\n"
        "            Device Attributes\n                Shared\n                    Multiprocessor count  : 14\n"
        "            FB Memory Usage\n                Total                     : 9728 MiB\n"
        for k, gi in enumerate(SEVEN_GI)))
    + "    Processes                             : None\n\n"
    for bus, mode in (("07", "Disabled"), ("0F", "Enabled")))


def test_mig_query_gives_each_slices_instance_ids() -> None:
    from gpu_cost.perceive.nodes import parse_mig_query

    ids = parse_mig_query(MIG_QUERY, "gpu01", {"0000:07:00.0": 0, "0000:0f:00.0": 1})
    assert ids == {(1, k): (gi, 0) for k, gi in enumerate(SEVEN_GI)}
    # without the numbering a block is the n-th GPU, as nvidia-smi prints them in index order
    assert parse_mig_query(MIG_QUERY, "gpu01", {}) == ids
    assert parse_mig_query("", "gpu01", {}) == {}


@pytest.mark.parametrize(("old", "new", "error"), [
    ("GPU Instance ID               : 9", "GPU Instance ID               : nine",
     r"gpu01: nvidia-smi -q line \d+: GPU Instance ID 'nine' is not a number"),
    ("            GPU Instance ID               : 9\n", "",
     r"gpu01: nvidia-smi -q line \d+: MIG device without GPU Instance ID"),
    ("            Index                         : 3\n", "            Index                         : 2\n",
     r"gpu01: nvidia-smi -q line \d+: MIG device index 2 listed twice on GPU 1"),
    ("GPU 00000000:0F:00.0", "GPU 00000000:3B:00.0", r"gpu01: nvidia-smi -q line \d+: GPU 00000000:3B:00.0 is not"),
])
def test_a_malformed_mig_query_names_host_and_line(old: str, new: str, error: str) -> None:
    from gpu_cost.perceive.nodes import parse_mig_query

    assert old in MIG_QUERY
    with pytest.raises(SourceError, match=error):
        parse_mig_query(MIG_QUERY.replace(old, new, 1), "gpu01", {"0000:07:00.0": 0, "0000:0f:00.0": 1})
