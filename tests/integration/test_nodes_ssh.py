"""GPU processes and node actions over a real sshd, through the node wrapper as a forced command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from gpu_cost.actions.base import ActionContext
from gpu_cost.model import Decision
from gpu_cost.sources.nodes import NodeAccess, NodeSource
from tests.fixtures.sshd import SshNode

pytestmark = pytest.mark.integration

GPU0 = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "gpu0.node.test"))
GPU1 = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "gpu1.node.test"))
GPUS = [{"index": 0, "uuid": GPU0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 2048,
         "utilization": 0},
        {"index": 1, "uuid": GPU1, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 0,
         "utilization": 0}]


def start_ts(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    ticks = int(stat[stat.rindex(")") + 2:].split()[19])
    btime = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime "))
    return int(btime + ticks / os.sysconf("SC_CLK_TCK"))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process started by the test, standing for a leftover training process."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)


@pytest.fixture
def wrapper_conn(sshd_node: SshNode, monkeypatch: pytest.MonkeyPatch) -> NodeAccess:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_NODE_SSH", sshd_node.conn_env(sshd_node.wrapper_key,
                                                                             hosts={"gpu01": "127.0.0.1"}))
    return NodeAccess.from_connection()


def _decision(pid: int, start: int, gpu_uuid: str = GPU0) -> Decision:
    return Decision(decision_id=f"d{pid}", ts=time.time(), rule="zombie", target_kind="process",
                    target=f"proc:gpu01:{pid}:{start}", action="kill_process", mode="enforce", host="gpu01", gpus=1,
                    evidence={"pid": pid, "process_start_ts": start, "gpu_uuid": gpu_uuid})


def _ctx(policy, access: NodeAccess, dry_run: bool = False) -> ActionContext:  # type: ignore[no-untyped-def]
    return ActionContext(policy=policy, dry_run=dry_run, now=time.time(), run_id="t", node_runner=access.runner,
                         sleep=lambda s: time.sleep(min(s, 0.3)), extra={"node_access": access, "kill_grace_s": 1})


@pytest.mark.parametrize(
    "command",
    [["ls"], [";rm", "-rf", "/tmp/x"], ["inspect;", "ls"], ["inspect", ";", "ls"], ["kill-process", "12x", "1", GPU0, "TERM"],
     ["kill-process", "1", "1", GPU0, "TERM"], ["kill-process", "123", "1", "not-a-uuid", "TERM"],
     ["kill-process", "123", "1", GPU0, "HUP"], ["power-off", "now"], ["bash", "-c", "id"]],
    ids=["ls", "semicolon-rm", "glued-semicolon", "separate-semicolon", "bad-pid", "pid-1", "bad-uuid", "bad-signal",
         "extra-arg", "bash"],
)
def test_wrapper_refuses_anything_else(sshd_node: SshNode, command: list[str]) -> None:
    res = sshd_node.ssh(sshd_node.wrapper_key, *command)
    assert res.returncode == 2, (res.stdout, res.stderr)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["ok"] is False and out["code"] == 2
    assert "uid=" not in res.stdout and "bin" not in res.stdout.split('"error"')[0]


def test_plain_key_sees_the_fake_nvidia_smi_first_on_path(sshd_node: SshNode) -> None:
    sshd_node.set_state(gpus=GPUS, processes=[])
    res = sshd_node.ssh(sshd_node.shell_key, "nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"0, {GPU0}", f"1, {GPU1}"]


def test_orphan_and_job_processes_over_ssh(sshd_node: SshNode, wrapper_conn: NodeAccess, sleeper) -> None:  # type: ignore[no-untyped-def]
    job_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                                env={**os.environ, "SLURM_JOB_ID": "4242"})
    try:
        sshd_node.set_state(gpus=GPUS, processes=[
            {"pid": sleeper.pid, "gpu_uuid": GPU0, "used_mib": 2048, "name": "python"},
            {"pid": job_proc.pid, "gpu_uuid": GPU1, "used_mib": 512, "name": "python"},
            {"pid": 999999, "gpu_uuid": GPU1, "used_mib": 1, "name": "gone"},  # exited: nvidia-smi forgets it
        ])
        inspection = NodeSource(wrapper_conn).inspect("gpu01")
    finally:
        job_proc.kill()
        job_proc.wait(5)
    assert [g.uuid for g in inspection.gpus] == [GPU0, GPU1]
    by_pid = {p.pid: p for p in inspection.processes}
    assert set(by_pid) == {sleeper.pid, job_proc.pid}
    orphan = by_pid[sleeper.pid]
    assert orphan.job_id is None and orphan.container is None
    assert orphan.host == "gpu01" and orphan.gpu == 0 and orphan.used_mib == 2048
    assert orphan.start_ts == start_ts(sleeper.pid)
    assert orphan.key == f"proc:gpu01:{sleeper.pid}:{start_ts(sleeper.pid)}"
    assert by_pid[job_proc.pid].job_id == "4242"


def test_kill_orphan_process_through_the_wrapper(sshd_node: SshNode, wrapper_conn: NodeAccess, policy, sleeper) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.actions.node import kill_process

    sshd_node.set_state(gpus=GPUS, processes=[{"pid": sleeper.pid, "gpu_uuid": GPU0, "used_mib": 2048}])
    d = _decision(sleeper.pid, start_ts(sleeper.pid))
    dry = kill_process(d, _ctx(policy, wrapper_conn, dry_run=True))
    assert dry.status == "skipped" and "kill-process" in (dry.command or "")
    time.sleep(0.3)
    assert sleeper.poll() is None, "dry-run must not touch the process"
    out = kill_process(d, _ctx(policy, wrapper_conn))
    assert out.status == "succeeded", (out.error, out.output)
    assert sleeper.wait(10) == -15  # SIGTERM was enough
    again = kill_process(d, _ctx(policy, wrapper_conn))
    assert again.status == "succeeded" and again.details["result"] == "already gone"


def test_kill_escalates_to_sigkill(sshd_node: SshNode, wrapper_conn: NodeAccess, policy) -> None:  # type: ignore[no-untyped-def]
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE,
                                start_new_session=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == b"ready"
        sshd_node.set_state(gpus=GPUS, processes=[{"pid": stubborn.pid, "gpu_uuid": GPU0, "used_mib": 2048}])
        from gpu_cost.actions.node import kill_process

        out = kill_process(_decision(stubborn.pid, start_ts(stubborn.pid)), _ctx(policy, wrapper_conn))
        assert out.status == "succeeded", (out.error, out.output)
        assert stubborn.wait(10) == -9
        assert "TERM: rc=0" in out.output and "KILL: rc=0" in out.output
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
        stubborn.wait(5)


@pytest.mark.parametrize("case", ["pid-reused", "other-gpu", "gone"])
def test_kill_refuses_a_stranger(sshd_node: SshNode, wrapper_conn: NodeAccess, policy, sleeper, case: str) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.actions.node import kill_process

    sshd_node.set_state(gpus=GPUS, processes=[{"pid": sleeper.pid, "gpu_uuid": GPU0, "used_mib": 2048}])
    real = start_ts(sleeper.pid)
    if case == "pid-reused":
        d = _decision(sleeper.pid, real - 3600)  # the agent saw another process under this PID an hour ago
    elif case == "other-gpu":
        d = _decision(sleeper.pid, real, GPU1)
    else:
        d = _decision(999999, real)
    out = kill_process(d, _ctx(policy, wrapper_conn))
    time.sleep(0.3)
    assert sleeper.poll() is None, "a process that is not the one found must never be signalled"
    if case == "gone":
        assert out.status == "succeeded" and out.details["result"] == "already gone"
    else:
        assert out.status == "skipped" and out.details["result"] == "refused"
        assert ("reused" if case == "pid-reused" else "does not hold") in (out.error or "")


def test_power_off_only_without_gpu_processes(sshd_node: SshNode, sleeper) -> None:  # type: ignore[no-untyped-def]
    sshd_node.systemctl_log.unlink(missing_ok=True)
    sshd_node.set_state(gpus=GPUS, processes=[{"pid": sleeper.pid, "gpu_uuid": GPU0, "used_mib": 2048}])
    busy = sshd_node.ssh(sshd_node.wrapper_key, "power-off")
    assert busy.returncode == 4 and not sshd_node.systemctl_log.exists()
    sshd_node.set_state(gpus=GPUS, processes=[])
    free = sshd_node.ssh(sshd_node.wrapper_key, "gpu-cost-node-action", "power-off")
    assert free.returncode == 0, free.stderr
    assert sshd_node.systemctl_log.read_text().split() == ["poweroff"]
