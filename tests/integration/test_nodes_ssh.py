"""GPU processes and node actions over a real sshd, through the node wrapper as a forced command."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from gpu_cost.act.base import ActionContext
from gpu_cost.core.model import Decision
from gpu_cost.perceive.nodes import NodeAccess, NodeSource
from tests.fixtures.sshd import SshNode
from tests.fixtures.users import PLAIN_USER, ensure_plain_user

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


OWNER = PLAIN_USER  # a person's account (the wrapper never signals a system account's): leftovers run as it


def spawn(argv: list[str], user: str | None = OWNER, **kw: object) -> subprocess.Popen[bytes]:
    if user == OWNER:
        ensure_plain_user()
    return subprocess.Popen(argv, start_new_session=True, user=user, **kw)  # type: ignore[call-overload,no-any-return]


def reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process started by the test as a plain user, standing for a leftover training process."""
    proc = spawn(["/bin/sleep", "600"])
    yield proc
    reap(proc)


@pytest.fixture
def wrapper_conn(sshd_node: SshNode, monkeypatch: pytest.MonkeyPatch) -> NodeAccess:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_NODE_SSH", sshd_node.conn_env(sshd_node.wrapper_key,
                                                                             hosts={"gpu01": "127.0.0.1"}))
    return NodeAccess.from_connection()


def _decision(pid: int, start: int, gpu_uuid: str = GPU0, user: str = OWNER,
              evidence: dict[str, object] | None = None) -> Decision:
    return Decision(decision_id=f"d{pid}", ts=time.time(), rule="zombie", target_kind="process",
                    target=f"proc:gpu01:{pid}:{start}", action="kill_process", mode="enforce", host="gpu01", gpus=1,
                    user=user, evidence={"pid": pid, "process_start_ts": start, "gpu_uuid": gpu_uuid, **(evidence or {})})


def _ctx(policy, access: NodeAccess, dry_run: bool = False) -> ActionContext:  # type: ignore[no-untyped-def]
    return ActionContext(policy=policy, dry_run=dry_run, now=time.time(), run_id="t", node_runner=access.runner,
                         sleep=lambda s: time.sleep(min(s, 0.3)), extra={"node_access": access, "kill_grace_s": 1})


@pytest.mark.parametrize(
    "command",
    [["ls"], [";rm", "-rf", "/tmp/x"], ["inspect;", "ls"], ["inspect", ";", "ls"],
     ["kill-process", "12x", "1", GPU0, OWNER, "TERM"], ["kill-process", "1", "1", GPU0, OWNER, "TERM"],
     ["kill-process", "9999999999", "1", GPU0, OWNER, "TERM"], ["kill-process", "99999999", "1", GPU0, OWNER, "TERM"],
     ["kill-process", "-5", "1", GPU0, OWNER, "TERM"], ["kill-process", "123", "-1", GPU0, OWNER, "TERM"],
     ["kill-process", "123", "1e9", GPU0, OWNER, "TERM"], ["kill-process", "123", "1", "not-a-uuid", OWNER, "TERM"],
     ["kill-process", "123", "1", GPU0, OWNER, "HUP"], ["kill-process", "123", "1", GPU0, "TERM"],
     ["kill-process", "123", "1", GPU0, "a/b", "TERM"], ["kill-process", "123", "1", GPU0, OWNER, "TERM", "yes"],
     ["power-off", "now"], ["bash", "-c", "id"]],
    ids=["ls", "semicolon-rm", "glued-semicolon", "separate-semicolon", "non-numeric-pid", "pid-1", "ten-digit-pid",
         "pid-over-pid-max", "negative-pid", "negative-start", "exponent-start", "bad-uuid", "bad-signal",
         "no-owner", "bad-owner", "bad-flag", "extra-arg", "bash"],
)
def test_wrapper_refuses_anything_else(sshd_node: SshNode, command: list[str]) -> None:
    res = sshd_node.ssh(sshd_node.wrapper_key, *command)
    assert res.returncode == 2, (res.stdout, res.stderr)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["ok"] is False and out["code"] == 2
    assert "uid=" not in res.stdout and "bin" not in res.stdout.split('"error"')[0]
    # one line on stderr, never a traceback
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr + res.stdout, res.stderr
    assert res.stderr.startswith("gpu-cost-node-action: ")


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
    from gpu_cost.act.node import kill_process

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
    # SIGTERM ignored by the shell stays ignored in the sleep it becomes
    stubborn = spawn(["/bin/sh", "-c", "trap '' TERM; echo ready; exec /bin/sleep 600"], stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == b"ready"
        sshd_node.set_state(gpus=GPUS, processes=[{"pid": stubborn.pid, "gpu_uuid": GPU0, "used_mib": 2048}])
        from gpu_cost.act.node import kill_process

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
    from gpu_cost.act.node import kill_process

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


# -- processes that are not ours ----------------------------------------------------------------


@pytest.fixture
def fake_squeue(sshd_node: SshNode) -> Iterator[Callable[[str, int], None]]:
    """Put a ``squeue`` first on the node's PATH that prints ``out`` (on stderr when ``rc`` is not 0)."""
    path = sshd_node.bin / "squeue"

    def answer(out: str, rc: int = 0) -> None:
        stream = "" if rc == 0 else " >&2"
        path.write_text(f"#!/bin/sh\necho '{out}'{stream}\nexit {rc}\n")
        path.chmod(0o755)

    yield answer
    path.unlink(missing_ok=True)


def _kill(sshd_node: SshNode, access: NodeAccess, policy, proc: subprocess.Popen[bytes], user: str = OWNER,  # type: ignore[no-untyped-def]
          evidence: dict[str, object] | None = None):
    from gpu_cost.act.node import kill_process

    sshd_node.set_state(gpus=GPUS, processes=[{"pid": proc.pid, "gpu_uuid": GPU0, "used_mib": 2048}])
    return kill_process(_decision(proc.pid, start_ts(proc.pid), user=user, evidence=evidence), _ctx(policy, access))


def _untouched(proc: subprocess.Popen[bytes]) -> None:
    time.sleep(0.3)
    assert proc.poll() is None, "a process that is not ours must never be signalled"


def test_refuses_a_root_process(sshd_node: SshNode, wrapper_conn: NodeAccess, policy) -> None:  # type: ignore[no-untyped-def]
    proc = spawn(["/bin/sleep", "600"], user=None)  # the tests run as root
    try:
        out = _kill(sshd_node, wrapper_conn, policy, proc, user="root", evidence={"act_on_system": True})
        _untouched(proc)
        assert out.status == "skipped" and out.details["result"] == "refused", (out.error, out.output)
        assert out.error == f"process {proc.pid} runs as root (uid 0): never touching it"
    finally:
        reap(proc)


def test_refuses_another_owner(sshd_node: SshNode, wrapper_conn: NodeAccess, policy, sleeper) -> None:  # type: ignore[no-untyped-def]
    out = _kill(sshd_node, wrapper_conn, policy, sleeper, user="alice")
    _untouched(sleeper)
    assert out.status == "skipped" and out.details["result"] == "refused", (out.error, out.output)
    assert f"belongs to {OWNER} (uid {pwd.getpwnam(OWNER).pw_uid}), not alice" in (out.error or "")


@pytest.mark.parametrize("account", ["daemon", "nobody"], ids=["uid-under-uid-min", "nologin-shell"])
def test_never_a_system_account_whatever_the_agent_asks(sshd_node: SshNode, wrapper_conn: NodeAccess, policy,  # type: ignore[no-untyped-def]
                                                       account: str) -> None:
    """daemon (uid 1, under UID_MIN of /etc/login.defs) and nobody (uid 65534, a nologin shell):
    refused by the node even when the policy named the owner, and ``system-ok`` is no longer a word."""
    pw = pwd.getpwnam(account)
    why = (f"uid under UID_MIN {_uid_min()}" if pw.pw_uid < _uid_min() else f"login shell {pw.pw_shell}")
    proc = spawn(["/bin/sleep", "600"], user=account)
    try:
        out = _kill(sshd_node, wrapper_conn, policy, proc, user=account,
                    evidence={"act_on_owner": account, "act_on_system": True})
        _untouched(proc)
        assert out.status == "skipped" and out.details["result"] == "refused", (out.error, out.output)
        assert out.error == f"process {proc.pid} runs as system account {account} (uid {pw.pw_uid}, {why}): never touching it"
        # asked directly, the old flag included: refused as a bad command, the process untouched
        res = sshd_node.ssh(sshd_node.wrapper_key, "kill-process", str(proc.pid), str(start_ts(proc.pid)), GPU0,
                            account, "TERM", "system-ok")
        assert res.returncode == 2 and "system-ok is not accepted" in res.stderr, (res.stdout, res.stderr)
        res = sshd_node.ssh(sshd_node.wrapper_key, "kill-process", str(proc.pid), str(start_ts(proc.pid)), GPU0,
                            account, "KILL")
        assert res.returncode == 4, (res.stdout, res.stderr)
        assert json.loads(res.stdout.strip().splitlines()[-1])["uid"] == pw.pw_uid
        _untouched(proc)
    finally:
        reap(proc)


def _uid_min() -> int:
    for line in Path("/etc/login.defs").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "UID_MIN":
            return int(fields[1])
    return 1000


# cgroup paths as the runtimes make them (systemd and cgroupfs drivers), under a folder of the test's own
CONTAINER_CGROUPS = {
    "docker": ("system.slice/docker-{id}.scope", "docker-{id}.scope", "docker"),
    "kubernetes": ("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod}.slice/"
                   "cri-containerd-{id}.scope", "kubepods.slice", "kubepods"),
    "podman": ("machine.slice/libpod-{id}.scope", "libpod-{id}.scope", "podman"),
    "cri-o": ("kubepods/burstable/pod{pod}/crio-{id}.scope", "kubepods", "kubepods"),
    "lxc": ("lxc.payload.web1", "lxc.payload.web1", None),
}


def _cgroup_mount() -> tuple[Path, str]:
    """A cgroup hierarchy this test may make folders in: cgroup v2 if mounted, else v1's name=systemd."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, opts = line.split()[:4]
        if kind == "cgroup2":
            found.setdefault("v2", Path(where))
        elif kind == "cgroup" and "name=systemd" in opts.split(","):
            found.setdefault("v1", Path(where))
    for key in ("v2", "v1"):
        if key in found and os.access(found[key], os.W_OK):
            return found[key], key
    pytest.skip("no writable cgroup hierarchy to put a process in a container's cgroup")


@pytest.fixture
def in_cgroup() -> Iterator[Callable[[subprocess.Popen[bytes], str], str]]:
    """Move a process into a real cgroup folder at ``relative`` (under a folder of this test's own)."""
    mount, _ = _cgroup_mount()
    top = mount / f"gpu-cost-test-{os.getpid()}-{time.monotonic_ns()}"
    made: list[Path] = []
    moved: list[int] = []

    def move(proc: subprocess.Popen[bytes], relative: str) -> str:
        target = top / relative
        for d in [top, *[top / Path(*Path(relative).parts[:i + 1]) for i in range(len(Path(relative).parts))]]:
            if not d.exists():
                d.mkdir()
                made.append(d)
        (target / "cgroup.procs").write_text(str(proc.pid))
        moved.append(proc.pid)
        return "/" + str(target.relative_to(mount))

    yield move
    for pid in moved:
        try:
            (mount / "cgroup.procs").write_text(str(pid))  # back to the root, if still alive
        except OSError:
            pass
    for d in reversed(made):
        for _ in range(20):
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # a process that just exited may still be counted for a moment


@pytest.mark.parametrize("runtime", sorted(CONTAINER_CGROUPS))
def test_never_a_process_in_a_container(sshd_node: SshNode, wrapper_conn: NodeAccess, policy, sleeper, in_cgroup,  # type: ignore[no-untyped-def]
                                        runtime: str) -> None:
    """A person's process moved into a real cgroup named as a container runtime names it: the node
    reads ``/proc/<pid>/cgroup`` and refuses to signal it, whatever the agent asks; the agent's own
    inspection sees the container too, so the sweep only reports it."""
    from gpu_cost.perceive.nodes import container_of

    template, component, seen_as = CONTAINER_CGROUPS[runtime]
    cid, pod = uuid.uuid4().hex * 2, str(uuid.uuid4()).replace("-", "_")
    path = in_cgroup(sleeper, template.format(id=cid, pod=pod))
    with open(f"/proc/{sleeper.pid}/cgroup") as fh:
        cgroup = fh.read()
    assert path in cgroup, cgroup  # the kernel itself says so
    out = _kill(sshd_node, wrapper_conn, policy, sleeper)
    _untouched(sleeper)
    assert out.status == "skipped" and out.details["result"] == "refused", (out.error, out.output)
    assert out.error == (f"process {sleeper.pid} runs in a container (cgroup {component.format(id=cid)[:80]}): never "
                         "touching it; stop it through its runtime")
    res = sshd_node.ssh(sshd_node.wrapper_key, "kill-process", str(sleeper.pid), str(start_ts(sleeper.pid)), GPU0,
                        OWNER, "KILL")
    assert res.returncode == 4 and "runs in a container" in res.stderr, (res.stdout, res.stderr)
    _untouched(sleeper)
    if seen_as is not None:  # the agent's inspection classifies it as well (lxc: the node alone)
        found = container_of(cgroup)
        assert found is not None and found[0] == seen_as, found


@pytest.mark.parametrize(
    ("var", "squeue", "rc", "expect"),
    [("SLURM_JOB_ID", "RUNNING", 0, "skipped"), ("SLURM_JOBID", "SUSPENDED", 0, "skipped"),
     ("SLURM_JOB_ID", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)", 1, "failed"),
     ("SLURM_JOB_ID", "slurm_load_jobs error: Invalid job id specified", 1, "succeeded"),
     ("SLURM_JOB_ID", "COMPLETED", 0, "succeeded")],
    ids=["running", "suspended-old-variable", "squeue-unreachable", "job-purged", "job-completed"],
)
def test_slurm_job_in_the_environment(sshd_node: SshNode, wrapper_conn: NodeAccess, policy, fake_squeue,  # type: ignore[no-untyped-def]
                                      var: str, squeue: str, rc: int, expect: str) -> None:
    fake_squeue(squeue, rc)
    proc = spawn(["/bin/sleep", "600"], env={"PATH": "/usr/bin:/bin", var: "4242"})
    try:
        out = _kill(sshd_node, wrapper_conn, policy, proc)
        assert out.status == expect, (out.error, out.output)
        if expect == "succeeded":
            assert proc.wait(10) == -15
            return
        _untouched(proc)
        if expect == "skipped":
            assert out.error == f"process {proc.pid} belongs to Slurm job 4242, still {squeue} per squeue: not touching it"
        else:  # cannot check: refuse, fail safe
            assert out.error is not None and out.error.startswith("TERM failed (5): cannot check Slurm job 4242")
            assert "Unable to contact slurm controller" in out.error
    finally:
        reap(proc)


def test_no_pidfd_no_signal(sshd_node: SshNode, wrapper_conn: NodeAccess, policy) -> None:  # type: ignore[no-untyped-def]
    # a thread's id is a PID to /proc but pidfd_open refuses it (EINVAL: not a thread-group leader);
    # a plain kill() of it would hit the whole process
    proc = spawn(["/usr/bin/python3", "-c", "import threading, time; t = threading.Thread(target=time.sleep, "
                  "args=(600,), daemon=True); t.start(); print(t.native_id, flush=True); time.sleep(600)"],
                 stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        tid = int(proc.stdout.readline())
        assert tid != proc.pid and os.path.exists(f"/proc/{tid}/stat")
        from gpu_cost.act.node import kill_process

        sshd_node.set_state(gpus=GPUS, processes=[{"pid": tid, "gpu_uuid": GPU0, "used_mib": 2048}])
        out = kill_process(_decision(tid, start_ts(tid)), _ctx(policy, wrapper_conn))
        _untouched(proc)
        assert out.status == "failed", (out.error, out.output)
        # EINVAL on older kernels, ENOENT on newer ones: either way not "gone", and no plain kill()
        assert re.fullmatch(rf"TERM failed \(5\): cannot hold process {tid} by a pidfd \((Invalid argument|"
                            r"No such file or directory)\): not signalling it", out.error or ""), out.error
    finally:
        reap(proc)


# -- MIG: a zombie on one slice, a running job on the next ---------------------------------------

MIG_A = "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "gpu0.mig1.node.test"))
MIG_B = "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "gpu0.mig2.node.test"))
MIG_GPUS = [{"index": 0, "uuid": GPU0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 6144,
             "utilization": None, "mig": [
                 {"gi": 1, "profile": "1g.10gb", "uuid": MIG_A, "memory_total": 10240, "memory_used": 2048},
                 {"gi": 2, "profile": "2g.20gb", "uuid": MIG_B, "memory_total": 20480, "memory_used": 4096}]}]


def _slices_snapshot(policy, now: float, processes, jobs, *, migs=("1", "2"),  # type: ignore[no-untyped-def]
                     profiles=("1g.10gb", "2g.20gb")):
    """Two idle slices of GPU 0 on gpu01, both holding memory, as dcgm-exporter's series give them."""
    from gpu_cost.perceive.snapshot import from_matrix

    step = policy.sweep.sample_interval
    times = np.arange(now - policy.sweep.lookback + step, now + 1, step)
    n = len(times)
    return from_matrix(
        policy=policy, now=now, source="test", hosts=np.array(["gpu01", "gpu01"], dtype=object),
        gpus=np.array([0, 0]), uuids=np.array([GPU0, GPU0], dtype=object), models=np.array(["a100", "a100"], dtype=object),
        mem_total=np.array([10240.0, 20480.0]), times=times, util=np.zeros((2, n)),
        mem=np.vstack([np.full(n, 2048.0), np.full(n, 4096.0)]), power=np.full((2, n), 60.0),
        job=np.full((2, n), "", dtype=object), jobs=jobs, processes=processes, nodes=[],
        mig={"mig": np.array(list(migs), dtype=object), "mig_profile": np.array(list(profiles), dtype=object),
             "mig_uuid": np.array(["", ""], dtype=object), "share": np.array([1 / 7, 2 / 7])})


def test_mig_zombie_only_on_its_slice_and_the_running_jobs_slice_refused(  # type: ignore[no-untyped-def]
        sshd_node: SshNode, wrapper_conn: NodeAccess, policy, sleeper, fake_squeue) -> None:
    from gpu_cost.act.node import kill_process
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.core.model import Job

    fake_squeue("RUNNING")
    job_proc = spawn(["/bin/sleep", "600"], env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242"})
    try:
        sshd_node.set_state(gpus=MIG_GPUS, processes=[
            {"pid": sleeper.pid, "gpu_uuid": MIG_A, "used_mib": 2048, "name": "python"},
            {"pid": job_proc.pid, "gpu_uuid": MIG_B, "used_mib": 4096, "name": "python"}])
        seen = NodeSource(wrapper_conn).inspect("gpu01")
        by_pid = {p.pid: p for p in seen.processes}
        assert by_pid[sleeper.pid].gpu == 0 and by_pid[sleeper.pid].mig_profile == "1g.10gb"
        assert by_pid[job_proc.pid].job_id == "4242" and by_pid[job_proc.pid].gpu_uuid == MIG_B

        now = time.time()
        job = Job("4242", OWNER, state="RUNNING", start_ts=now - 7200, nodes=("gpu01",), gpu_alloc=(("gpu01", (0,)),))
        snap = _slices_snapshot(policy, now, seen.processes, [job])
        rows = snap.gpus.set_index("mig")
        assert rows.loc["2", "job_id"] == "4242" and rows.loc["2", "attribution"] == "cgroup"
        assert rows.loc["1", "attribution"] == "none" and rows.loc["1", "mig_uuid"] == MIG_A
        zombies = [f for f in run_rules(snap, policy) if f.rule == "zombie"]
        assert [f.evidence["pid"] for f in zombies] == [sleeper.pid], "only the finished job's process is a zombie"
        z = zombies[0]
        assert z.gpu_ids == ("gpu01:0/mig1",) and z.evidence["gpu_uuid"] == MIG_A

        # the wrapper refuses the running job's process on the other slice (re-checked on the node) ...
        refused = kill_process(_decision(job_proc.pid, start_ts(job_proc.pid), gpu_uuid=MIG_B), _ctx(policy, wrapper_conn))
        _untouched(job_proc)
        assert refused.status == "skipped" and refused.details["result"] == "refused", (refused.error, refused.output)
        assert refused.error == f"process {job_proc.pid} belongs to Slurm job 4242, still RUNNING per squeue: not touching it"
        # ... and the zombie's kill names its slice's MIG UUID, which the node checks it still holds
        wrong = kill_process(_decision(sleeper.pid, start_ts(sleeper.pid), gpu_uuid=MIG_B), _ctx(policy, wrapper_conn))
        assert wrong.status == "skipped" and f"does not hold GPU {MIG_B}" in (wrong.error or ""), wrong.error
        out = kill_process(_decision(sleeper.pid, int(z.evidence["process_start_ts"]), gpu_uuid=z.evidence["gpu_uuid"]),
                           _ctx(policy, wrapper_conn))
        assert out.status == "succeeded", (out.error, out.output)
        assert sleeper.wait(10) == -15
        assert job_proc.poll() is None
    finally:
        reap(job_proc)


def test_mig_zombie_found_on_one_of_two_slices_of_the_same_profile(  # type: ignore[no-untyped-def]
        sshd_node: SshNode, wrapper_conn: NodeAccess, policy, sleeper, fake_squeue) -> None:
    """Two 1g.10gb slices (GPU instances 9 and 10): the wrapper's nvidia-smi -q tells them apart."""
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.core.model import Job

    fake_squeue("RUNNING")
    job_proc = spawn(["/bin/sleep", "600"], env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242"})
    try:
        gpus = [{**MIG_GPUS[0], "mig": [
            {"gi": 9, "profile": "1g.10gb", "uuid": MIG_A, "memory_total": 10240, "memory_used": 2048},
            {"gi": 10, "profile": "1g.10gb", "uuid": MIG_B, "memory_total": 10240, "memory_used": 2048}]}]
        sshd_node.set_state(gpus=gpus, processes=[
            {"pid": sleeper.pid, "gpu_uuid": MIG_A, "used_mib": 2048, "name": "python"},
            {"pid": job_proc.pid, "gpu_uuid": MIG_B, "used_mib": 2048, "name": "python"}])
        seen = NodeSource(wrapper_conn).inspect("gpu01")
        by_pid = {p.pid: p for p in seen.processes}
        assert (by_pid[sleeper.pid].mig, by_pid[job_proc.pid].mig) == ("9", "10")
        assert {u: d.gi for u, d in seen.mig.items()} == {MIG_A: "9", MIG_B: "10"}

        now = time.time()
        job = Job("4242", OWNER, state="RUNNING", start_ts=now - 7200, nodes=("gpu01",), gpu_alloc=(("gpu01", (0,)),))
        snap = _slices_snapshot(policy, now, seen.processes, [job], migs=("9", "10"), profiles=("1g.10gb", "1g.10gb"))
        rows = snap.gpus.set_index("mig")
        assert rows.loc["10", "job_id"] == "4242" and rows.loc["10", "attribution"] == "cgroup"
        assert (rows.loc["9", "mig_uuid"], rows.loc["10", "mig_uuid"]) == (MIG_A, MIG_B)
        zombies = [f for f in run_rules(snap, policy) if f.rule == "zombie"]
        assert [(f.evidence["pid"], f.gpu_ids, f.evidence["gpu_uuid"]) for f in zombies] == [
            (sleeper.pid, ("gpu01:0/mig9",), MIG_A)]
    finally:
        reap(job_proc)
