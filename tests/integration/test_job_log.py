"""The tail of a real Slurm job's output, read through the node wrapper's read-only ``job-log`` verb
over the real sshd forced command (the session's ``slurm_cluster`` and ``sshd_node``).

The test cluster runs both ``slurmd`` (``gpu01``, ``gpu02``) on this host, so two more keys are added
to the sshd's ``authorized_keys`` for this module, as a deployment would write them
(``command="env ... gpu-cost-node-action"``): ``SLURM_CONF`` stands in for the node's
``/etc/slurm/slurm.conf``, and one key says ``GPU_COST_NODE_NAME=gpu01`` (this node is gpu01 and
nothing else), the other leaves the wrapper to ``hostname -s`` (which Slurm gives as both nodes'
NodeHostName here). Jobs run as root (the test process); the files "another user" owns belong to
``nobody``.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpu_cost.perceive.nodes import NodeAccess, NodeSource
from tests.fixtures.slurm import SlurmCluster
from tests.fixtures.sshd import WRAPPER, SshNode

pytestmark = pytest.mark.integration

OTHER = "nobody"


class Keys:
    def __init__(self, named: Path, by_host: Path) -> None:
        self.named = named  # GPU_COST_NODE_NAME=gpu01
        self.by_host = by_host  # hostname -s


@pytest.fixture(scope="module")
def keys(sshd_node: SshNode, slurm_cluster: SlurmCluster) -> Iterator[Keys]:
    auth = sshd_node.root / "authorized_keys"
    before = auth.read_text()
    lines = []
    made = []
    for name, env in (("id_joblog_gpu01", f"SLURM_CONF={slurm_cluster.conf} GPU_COST_NODE_NAME=gpu01"),
                      ("id_joblog_host", f"SLURM_CONF={slurm_cluster.conf}")):
        key = sshd_node.root / name
        if not key.exists():
            pub = sshd_node._keygen(key)
        else:
            pub = Path(f"{key}.pub").read_text().strip()
        made.append(key)
        lines.append(f'restrict,command="env {env} {shlex.quote(str(WRAPPER))}" {pub}')
    auth.write_text(before + "".join(f"{line}\n" for line in lines))
    try:
        yield Keys(*made)
    finally:
        auth.write_text(before)


def _source(sshd_node: SshNode, key: Path, monkeypatch: pytest.MonkeyPatch) -> NodeSource:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_NODE_SSH", sshd_node.conn_env(
        key, hosts={"gpu01": "127.0.0.1", "gpu02": "127.0.0.1"}))
    return NodeSource(NodeAccess.from_connection())


@pytest.fixture
def named(sshd_node: SshNode, keys: Keys, monkeypatch: pytest.MonkeyPatch) -> NodeSource:
    """The agent's NodeSource reaching the wrapper that calls itself gpu01."""
    return _source(sshd_node, keys.named, monkeypatch)


@pytest.fixture
def submit(slurm_cluster: SlurmCluster) -> Iterator[Callable[..., str]]:
    """Submit a job that prints ``script`` and then sleeps; cancelled at the end of the test."""
    ids: list[str] = []

    def run(script: str, *args: str, node: str = "gpu01", state: str = "RUNNING") -> str:
        jid = slurm_cluster.submit(script + "\nexec sleep 600\n", "--job-name=job-log-test", "--mem=100",
                                   f"--nodelist={node}", *args)
        ids.append(jid)
        slurm_cluster.wait_state(jid, state, timeout=30)
        return jid

    yield run
    for jid in ids:
        slurm_cluster.run("scancel", "--signal=KILL", jid)
    for jid in ids:
        slurm_cluster.wait_state(jid, ("CANCELLED", "COMPLETED", "FAILED", "GONE"), timeout=30)


def _out(slurm_cluster: SlurmCluster, jid: str, suffix: str = "out") -> Path:
    return slurm_cluster.root / "jobs" / f"{jid}.{suffix}"


def _wait_for(path: Path, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{path} never showed {text!r}")


def test_the_tail_of_a_running_job(slurm_cluster: SlurmCluster, named: NodeSource, submit) -> None:  # type: ignore[no-untyped-def]
    jid = submit('echo "epoch 1 loss 0.9"\necho "epoch 2 loss 0.5"\necho "some warning" >&2\n'
                 'echo "Training finished"\n', f"--error={slurm_cluster.root / 'jobs'}/%j.err", "--gres=gpu:1")
    out, err = _out(slurm_cluster, jid), _out(slurm_cluster, jid, "err")
    _wait_for(out, "Training finished")
    _wait_for(err, "some warning")
    log = named.job_log("gpu01", jid, 4096)
    assert log["error"] is None, log
    assert log["path"] == str(out) and log["size"] == out.stat().st_size + err.stat().st_size
    assert log["mtime"] == max(out.stat().st_mtime, err.stat().st_mtime)
    assert log["text"] == "epoch 1 loss 0.9\nepoch 2 loss 0.5\nTraining finished\nsome warning\n"
    assert [(f["stream"], f["path"], f["truncated"]) for f in log["files"]] == [
        ("stdout", str(out), False), ("stderr", str(err), False)]
    # what the lead's evidence reads out of it
    from gpu_cost.analyse import evidence
    from gpu_cost.config.schema import JobLogConfig

    said = evidence.classify_log(log, JobLogConfig(), time.time(), 600)
    assert said["state"] == "finished" and said["line"] == "Training finished"


def test_a_big_log_gives_at_most_max_bytes_ending_with_its_last_line(slurm_cluster: SlurmCluster, named: NodeSource,  # type: ignore[no-untyped-def]
                                                                     submit) -> None:
    jid = submit('for i in $(seq 1 6000); do echo "step $i loss 0.$i"; done\necho "LAST LINE of the run"\n')
    out = _out(slurm_cluster, jid)
    _wait_for(out, "LAST LINE of the run")
    log = named.job_log("gpu01", jid, 2048)
    assert log["error"] is None, log
    (f,) = log["files"]
    assert f["stream"] == "stdout+stderr" and f["truncated"] is True and f["size"] == out.stat().st_size > 50_000
    assert len(log["text"].encode()) <= 2048
    assert log["text"].endswith("step 6000 loss 0.6000\nLAST LINE of the run\n")
    assert log["text"].startswith("step ")  # whole lines only


def test_an_array_task(slurm_cluster: SlurmCluster, named: NodeSource, submit) -> None:  # type: ignore[no-untyped-def]
    jid = submit('echo "I am task $SLURM_ARRAY_TASK_ID"\n', "--array=0-1",
                 f"--output={slurm_cluster.root / 'jobs'}/%A_%a.out", state="RUNNING")
    _wait_for(slurm_cluster.root / "jobs" / f"{jid}_1.out", "I am task 1")
    log = named.job_log("gpu01", f"{jid}_1", 1024)
    assert log["error"] is None and log["text"] == "I am task 1\n", log


def _nobody_file(path: Path, text: str) -> Path:
    path.write_text(text)
    pw = pwd.getpwnam(OTHER)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def test_output_replaced_by_a_symlink_is_refused(slurm_cluster: SlurmCluster, named: NodeSource, submit) -> None:  # type: ignore[no-untyped-def]
    jid = submit('echo "the job\'s own line"\n')
    out = _out(slurm_cluster, jid)
    _wait_for(out, "own line")
    secret = _nobody_file(slurm_cluster.root / "jobs" / f"secret-{jid}.txt", "NOT THE JOB'S: never read\n")
    out.unlink()
    out.symlink_to(secret)  # the job (root) does not own the target; the link itself must not be followed
    log = named.job_log("gpu01", jid, 4096)
    assert log["error"] == (f"gpu01: job {jid}'s log not read: stdout+stderr {out}: "
                            "is a symbolic link: not following it"), log
    assert "never read" not in json.dumps(log)


def test_output_through_a_symlinked_directory_is_refused(slurm_cluster: SlurmCluster, named: NodeSource,  # type: ignore[no-untyped-def]
                                                        submit) -> None:
    """O_NOFOLLOW covers the last component only: a link to a 0700 directory earlier in the path is
    refused too (the wrapper walks every directory from ``/`` without following links), as root."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    private = slurm_cluster.root / "jobs" / f"private-{tag}"
    via = slurm_cluster.root / "jobs" / f"via-{tag}"
    private.mkdir(mode=0o700)
    via.symlink_to(private, target_is_directory=True)
    try:
        jid = submit('echo "BEHIND THE LINK: never read"\n', f"--output={via}/%j.out")
        out = private / f"{jid}.out"
        _wait_for(out, "BEHIND THE LINK")  # the job (root) owns it: only the link stands in the way
        log = named.job_log("gpu01", jid, 4096)
        assert log["error"] == (f"gpu01: job {jid}'s log not read: stdout+stderr {via}/{jid}.out: "
                                f"{via} in its path is a symbolic link: not following it"), log
        assert "never read" not in json.dumps(log)
    finally:
        via.unlink()
        shutil.rmtree(private, ignore_errors=True)


def test_output_replaced_by_a_file_of_another_user_is_refused(slurm_cluster: SlurmCluster, named: NodeSource,  # type: ignore[no-untyped-def]
                                                              submit) -> None:
    jid = submit('echo "the job\'s own line"\n')
    out = _out(slurm_cluster, jid)
    _wait_for(out, "own line")
    out.unlink()
    _nobody_file(out, "NOT THE JOB'S: never read\n")
    log = named.job_log("gpu01", jid, 4096)
    uid = pwd.getpwnam(OTHER).pw_uid
    assert log["error"] == f"gpu01: job {jid}'s log not read: stdout+stderr {out}: owned by uid {uid}, not the job's uid 0"
    assert "never read" not in json.dumps(log)


def test_a_job_on_another_node_is_refused(slurm_cluster: SlurmCluster, sshd_node: SshNode, keys: Keys, named: NodeSource,  # type: ignore[no-untyped-def]
                                          submit, monkeypatch: pytest.MonkeyPatch) -> None:
    jid = submit('echo "written on gpu02"\n', node="gpu02")
    _wait_for(_out(slurm_cluster, jid), "written on gpu02")
    log = named.job_log("gpu01", jid, 4096)
    assert log == {"error": f"gpu01: job-log {jid} exited 4: job {jid} runs its batch script on gpu02, not on this "
                            "node (gpu01): not reading its output"}
    # the wrapper that goes by `hostname -s` is both nodes here (Slurm's NodeHostName for gpu02)
    by_host = _source(sshd_node, keys.by_host, monkeypatch)
    log = by_host.job_log("gpu02", jid, 4096)
    assert log["error"] is None and log["text"] == "written on gpu02\n", log


def test_pending_and_unknown_jobs_are_refused(slurm_cluster: SlurmCluster, named: NodeSource, submit) -> None:  # type: ignore[no-untyped-def]
    jid = submit('echo "not yet"\n', "--begin=now+1hour", state="PENDING")
    log = named.job_log("gpu01", jid, 4096)
    assert log == {"error": f"gpu01: job-log {jid} exited 4: job {jid} is PENDING: it has no output yet"}
    log = named.job_log("gpu01", "999999", 4096)
    assert log == {"error": "gpu01: job-log 999999 exited 4: Slurm does not know job 999999: not reading its output"}


@pytest.mark.parametrize("command", [["job-log", "1;id"], ["job-log", "../../etc/passwd"], ["job-log", "/etc/shadow"],
                                     ["job-log", "1", "1000000"], ["job-log", "$(id)"], ["job-log", "1 2 3 4"]],
                         ids=["semicolon", "dotdot", "path", "oversized", "subshell", "many"])
def test_a_malformed_id_is_refused_with_exit_2(sshd_node: SshNode, keys: Keys, command: list[str]) -> None:
    res = sshd_node.ssh(keys.named, *command)
    assert res.returncode == 2, (res.stdout, res.stderr)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["ok"] is False and out["code"] == 2 and "uid=" not in res.stdout and "root:" not in res.stdout
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("gpu-cost-node-action: ")


@pytest.mark.parametrize("job_id", ["1;id", "$(id)", "../../etc/passwd", "1 2"])
def test_malformed_id_through_the_agent_is_refused_before_any_node_is_asked(named: NodeSource, job_id: str) -> None:
    """The agent checks the id against Slurm's forms itself; the wrapper's own refusal (above) is the second lock."""
    log = named.job_log("gpu01", job_id, 4096)
    assert log == {"error": f"gpu01: job-log {job_id!r}: not a Slurm job id"}, log


def test_unprivileged_reads_what_it_may_and_refuses_the_rest(slurm_cluster: SlurmCluster, submit,  # type: ignore[no-untyped-def]
                                                             tmp_path: Path) -> None:
    """Run as a plain user (no sudo rule): a readable file is read, an unreadable one refused."""
    jid = submit('echo "readable by anyone"\necho "for root only" >&2\n',
                 f"--error={slurm_cluster.root / 'jobs'}/%j.err")
    out, err = _out(slurm_cluster, jid), _out(slurm_cluster, jid, "err")
    _wait_for(out, "readable")
    _wait_for(err, "root only")
    out.chmod(0o644)
    err.chmod(0o600)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "SLURM_CONF": str(slurm_cluster.conf), "GPU_COST_NODE_NAME": "gpu01",
           "SSH_ORIGINAL_COMMAND": f"job-log {jid} 4096"}
    # the node's own Python (the venv's may live where a plain user cannot look)
    res = subprocess.run(["/usr/bin/python3", str(WRAPPER)], env=env, capture_output=True, text=True, timeout=60,
                         user=OTHER, cwd="/")
    assert res.returncode == 0, (res.stdout, res.stderr)
    got = json.loads(res.stdout)
    so, se = got["files"]
    assert so["stream"] == "stdout" and so["tail"] == "readable by anyone\n"
    assert se["stream"] == "stderr" and se["refused"].startswith("permission denied (no root copy: sudo -n: ")
    assert "for root only" not in res.stdout
    # root's processes: their environment is not this user's to read, so the job's are not seen
    assert got["activity"]["refused"].startswith("permission denied (no root copy: sudo -n: "), got["activity"]


def test_a_checkpoint_written_in_the_working_directory(slurm_cluster: SlurmCluster, named: NodeSource, submit) -> None:  # type: ignore[no-untyped-def]
    """A job whose script writes ``checkpoints/step_1.pt`` in its WorkDir: the wrapper, over the real
    sshd, names that file as the newest of the job's files there, and the evidence counts it."""
    wd = slurm_cluster.root / "jobs" / f"workdir-{os.getpid()}-{time.monotonic_ns()}"
    wd.mkdir()
    try:
        _checkpoint_in(wd, slurm_cluster, named, submit)
    finally:
        shutil.rmtree(wd, ignore_errors=True)  # the job itself is cancelled by `submit`


def _checkpoint_in(wd: Path, slurm_cluster: SlurmCluster, named: NodeSource, submit) -> None:  # type: ignore[no-untyped-def]
    started = time.time()
    jid = submit('mkdir -p checkpoints\necho "weights" > checkpoints/step_1.pt\necho "saved checkpoint step 1"\n',
                 f"--chdir={wd}")
    out = _out(slurm_cluster, jid)
    _wait_for(out, "saved checkpoint step 1")
    ckpt = wd / "checkpoints" / "step_1.pt"
    assert ckpt.exists()
    log = named.job_log("gpu01", jid, 4096)
    assert log["error"] is None, log
    assert log["workdir_newest"] == "checkpoints/step_1.pt", log
    assert log["workdir_mtime"] == ckpt.stat().st_mtime and log["workdir_mtime"] >= started - 2
    assert time.time() - log["workdir_mtime"] < 120
    from gpu_cost.analyse import evidence
    from gpu_cost.config.schema import JobLogConfig

    said = evidence.classify_log(log, JobLogConfig(), time.time(), 600)
    assert said["files_growing"] is True and said["files_newest"] == "checkpoints/step_1.pt"


def test_the_cpu_of_the_jobs_own_processes(slurm_cluster: SlurmCluster, named: NodeSource, submit) -> None:  # type: ignore[no-untyped-def]
    """A job busy on its CPUs (a data-loading phase, say) and one that only sleeps: the wrapper, over
    the real sshd, samples each job's own processes (``SLURM_JOB_ID`` in their environment: the test
    cluster has no job cgroups) for a second."""
    # the jobs run as root: back to niceness 0, so a CI run alongside (and `nice -n 19`) starve nothing
    busy = submit('renice -n 0 -p $$ >/dev/null 2>&1 || true\n'
                  '(while :; do :; done) &\n(while :; do :; done) &\necho "loading data"\n')
    idle = submit('echo "waiting for nothing"\n')
    _wait_for(_out(slurm_cluster, busy), "loading data")
    _wait_for(_out(slurm_cluster, idle), "waiting for nothing")
    log = named.job_log("gpu01", busy, 4096)
    assert log["error"] is None and log["text"] == "loading data\n", log
    # two spinning loops: at least a third of a core each even when the machine is shared
    assert log["cpu_cores"] > 0.3 and log["io_bps"] is not None, log
    quiet = named.job_log("gpu01", idle, 4096)
    assert quiet["error"] is None and quiet["cpu_cores"] is not None and quiet["cpu_cores"] < 0.1, quiet
    from gpu_cost.analyse import evidence
    from gpu_cost.config.schema import JobLogConfig

    said = evidence.classify_log(log, JobLogConfig(), time.time(), 600)
    assert said["cpu_cores"] == log["cpu_cores"] and said["io_bps"] == log["io_bps"]
