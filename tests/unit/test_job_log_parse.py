"""The node wrapper's read-only ``job-log`` verb, without a cluster: argument validation (as the
forced command sees it, through ``SSH_ORIGINAL_COMMAND``), ``scontrol show job`` as Slurm 22.05
printed it (captured), the checks on the node against a stand-in ``scontrol``, the agent's
:meth:`NodeSource.job_log` dict, and Slurm's batch flag on :class:`Job`.

The real thing (sbatch jobs on the test cluster, the real sshd forced command) is
``tests/integration/test_job_log.py``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpu_cost.core.model import Job
from gpu_cost.perceive.nodes import NodeAccess, NodeSource, job_node, parse_job_log
from gpu_cost.perceive.runner import Completed
from gpu_cost.perceive.slurm import parse_jobs

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "include" / "node" / "gpu-cost-node-action"
DATA = ROOT / "tests" / "data" / "slurm"
HOST = socket.gethostname().split(".")[0]


def load_wrapper() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("gpu_cost_node_action", str(WRAPPER))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


node_action = load_wrapper()


# -- a stand-in scontrol ------------------------------------------------------------------------

FAKE_SCONTROL = """#!/usr/bin/env python3
import os, sys
d = os.environ["FAKE_SCONTROL_DIR"]
with open(os.path.join(d, "calls"), "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\\n")
which = "node" if "node" in sys.argv[1:4] else "job"
path = os.path.join(d, which + ".txt")
text = open(path).read() if os.path.exists(path) else ""
rc = int(open(os.path.join(d, which + ".rc")).read()) if os.path.exists(os.path.join(d, which + ".rc")) else 0
(sys.stdout if rc == 0 else sys.stderr).write(text)
sys.exit(rc)
"""


class Node:
    """Runs the wrapper as the forced command would, with a stand-in ``scontrol`` first on PATH."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "scontrol"
        self.dir.mkdir()
        (self.dir / "scontrol").write_text(FAKE_SCONTROL)
        (self.dir / "scontrol").chmod(0o755)
        self.files = root / "jobs"
        self.files.mkdir()

    def answer(self, text: str, rc: int = 0, node: str | None = None) -> None:
        (self.dir / "job.txt").write_text(text)
        (self.dir / "job.rc").write_text(str(rc))
        if node is not None:
            (self.dir / "node.txt").write_text(node)

    def calls(self) -> list[str]:
        p = self.dir / "calls"
        return p.read_text().splitlines() if p.exists() else []

    def run(self, command: str, node_name: str | None = "gpu01", timeout: float = 20,
            preexec_fn: Any = None) -> subprocess.CompletedProcess[str]:
        env = {"PATH": f"{self.dir}:/usr/bin:/bin", "SSH_ORIGINAL_COMMAND": command, "FAKE_SCONTROL_DIR": str(self.dir)}
        if node_name is not None:
            env["GPU_COST_NODE_NAME"] = node_name
        return subprocess.run([sys.executable, str(WRAPPER)], env=env, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=preexec_fn)


def job_text(job_id: str = "42", *, state: str = "RUNNING", uid: int | None = None, batch_host: str = "gpu01",
             stdout: str = "", stderr: str | None = None, name: str = "train", extra: str = "",
             workdir: str = "/tmp") -> str:
    """``scontrol show job`` of one job, in the layout Slurm 22.05 prints (see the captured files)."""
    uid = os.getuid() if uid is None else uid
    stderr = stdout if stderr is None else stderr
    return (f"JobId={job_id} JobName={name}\n"
            f"   UserId=u({uid}) GroupId=g({uid}) MCS_label=N/A\n"
            f"   JobState={state} Reason=None Dependency=(null)\n"
            f"   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0\n"
            f"   NodeList={batch_host}\n   BatchHost={batch_host}\n{extra}"
            f"   WorkDir={workdir}\n   StdErr={stderr}\n   StdIn=/dev/null\n   StdOut={stdout}\n   Power=\n\n")


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def answer_of(res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    return json.loads(lines[0])


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr + res.stdout, res.stderr
    assert res.stderr.startswith("gpu-cost-node-action: ")
    return res.stderr.strip()


# -- argument validation --------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    "job-log", "job-log 12 4096 more", "job-log 12;ls", "job-log '12; ls'", "job-log 12 ; ls", "job-log $(id)",
    "job-log `id`", "job-log ../../etc/passwd", "job-log ../12", "job-log /etc/shadow", "job-log ./12",
    "job-log 12/../13", "job-log 0", "job-log 012", "job-log -12", "job-log 12_", "job-log _3", "job-log 12_[0-3]",
    "job-log 12,13", "job-log 12.0", "job-log 1234567890123", "job-log 12 65537", "job-log 12 99999999",
    "job-log 12 511", "job-log 12 0", "job-log 12 -1", "job-log 12 1e4", "job-log 12 16k", "job-log 12 0x400",
    "job-log '12 '", "job-log 12\\n13", "job-log '12\n13'", "job-log '12\n'", "job-log 12 '4096\n'",
    "job-log \"unterminated", "job-log 12 ''",
], ids=lambda c: c.replace(" ", "_"))
def test_bad_arguments_are_refused_before_slurm_is_asked(node: Node, command: str) -> None:
    node.answer(job_text(stdout="/etc/passwd"))
    res = node.run(command)
    assert res.returncode == 2, (res.stdout, res.stderr)
    out = answer_of(res)
    assert out["ok"] is False and out["code"] == 2
    one_line_error(res)
    assert node.calls() == [], "a refused command must not reach scontrol"
    assert "root:" not in res.stdout


def test_limits_of_max_bytes_are_accepted(node: Node) -> None:
    log = node.files / "42.out"
    log.write_text("x\n" * 40000)
    node.answer(job_text(stdout=str(log)))
    for size in ("512", "65536"):
        res = node.run(f"job-log 42 {size}")
        assert res.returncode == 0, res.stderr
        (f,) = answer_of(res)["files"]
        assert len(f["tail"].encode()) <= int(size) and f["truncated"] is True


def test_an_array_task_id_is_accepted(node: Node) -> None:
    node.answer((DATA / "scontrol-job-array-22.05.txt").read_text())
    res = node.run("job-log 2_1", node_name="gpu02")
    assert res.returncode == 0, res.stderr  # the file is missing here: refused inside the answer, not the call
    out = answer_of(res)
    assert out["job_id"] == "2_1" and out["files"][0]["path"].endswith("/2_1.out")
    assert out["files"][0]["refused"] == "does not exist"
    assert node.calls() == ["show job 2_1"]


# -- scontrol show job, as Slurm 22.05 printed it ---------------------------------------------------


def test_parse_captured_job_with_spaces() -> None:
    (rec,) = node_action.parse_scontrol_jobs((DATA / "scontrol-job-22.05.txt").read_text())
    f = lambda k: node_action.field(rec, k, "1")  # noqa: E731
    assert f("JobId") == "1" and f("JobName") == "my job"
    assert f("UserId") == "root(0)" and node_action.job_uid(f("UserId")) == 0
    assert f("JobState") == "RUNNING" and f("BatchHost") == "gpu01" and f("NodeList") == "gpu01"
    assert f("StdOut") == "/tmp/gpu-cost-tests/slurm/jobs/1.out"
    assert f("StdErr") == "/tmp/gpu-cost-tests/slurm/jobs/my job-1.err"  # %x-%j, the name has a space
    assert f("TRES") == "cpu=1,mem=100M,node=1,billing=1,gres/gpu=1" and f("AllocNode:Sid") == "localhost:13934"


def test_parse_captured_array() -> None:
    records = node_action.parse_scontrol_jobs((DATA / "scontrol-job-array-22.05.txt").read_text())
    assert [(r["JobId"], r["ArrayTaskId"]) for r in records] == [(["2"], ["2"]), (["4"], ["1"]), (["3"], ["0"])]
    assert node_action.pick_job(records, "2_0")["JobId"] == ["3"]
    assert node_action.pick_job(records, "2")["ArrayTaskId"] == ["2"]  # job id 2 is task 2's record
    assert node_action.pick_job(records, "3")["ArrayTaskId"] == ["0"]
    assert node_action.pick_job(records, "2_7") is None and node_action.pick_job(records, "9") is None


def test_text_a_user_chose_cannot_pose_as_a_field() -> None:
    # captured: --job-name="n StdOut=/etc/shadow" --comment="hello UserId=x(5) there" --mail-user="a BatchHost=b"
    (rec,) = node_action.parse_scontrol_jobs((DATA / "scontrol-job-injected-22.05.txt").read_text())
    assert node_action.field(rec, "JobName", "7") == "n StdOut=/etc/shadow"
    assert node_action.field(rec, "StdOut", "7").endswith("/jobs/slurm-7.out")
    assert node_action.field(rec, "Comment", "7") == "hello UserId=x(5) there "
    assert node_action.field(rec, "UserId", "7") == "root(0)"
    with pytest.raises(node_action.Stop, match="BatchHost= 2 times"):
        node_action.field(rec, "BatchHost", "7")
    # the one-line form (-o) is not what the wrapper asks for: there the name would win
    (flat,) = node_action.parse_scontrol_jobs(" ".join((DATA / "scontrol-job-injected-22.05.txt").read_text().split()))
    assert "StdOut" not in flat and "UserId" not in flat  # swallowed by JobName: refused, never /etc/shadow


def test_parse_salloc_job_has_no_output() -> None:
    (rec,) = node_action.parse_scontrol_jobs((DATA / "scontrol-job-salloc-22.05.txt").read_text())
    assert node_action.field(rec, "BatchFlag", "8") == "0"
    assert node_action.field(rec, "StdOut", "8") == "" and node_action.field(rec, "BatchHost", "8") == "gpu01"


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu01", ["gpu01"]), ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]), ("", []),
])
def test_wrapper_hostlist(text: str, expected: list[str]) -> None:
    assert node_action.expand_hostlist(text) == expected


# -- the checks on the node, against a stand-in scontrol ------------------------------------------------


def test_reads_the_tail_of_stdout_and_stderr(node: Node) -> None:
    out, err = node.files / "42.out", node.files / "42 err.log"
    out.write_text("epoch 1\nepoch 2\nTraining finished\n")
    err.write_bytes("warning: ü".encode() + b"\xff\n")
    node.answer(job_text(stdout=str(out), stderr=str(err)))
    res = node.run("job-log 42 4096")
    assert res.returncode == 0, res.stderr
    got = answer_of(res)
    assert got["verb"] == "job-log" and got["job_id"] == "42" and got["job_state"] == "RUNNING" and got["ok"] is True
    so, se = got["files"]
    assert so == {"stream": "stdout", "path": str(out), "size": out.stat().st_size, "mtime": out.stat().st_mtime,
                  "tail": "epoch 1\nepoch 2\nTraining finished\n", "truncated": False}
    assert se["stream"] == "stderr" and se["path"] == str(err) and "\ufffd" in se["tail"]  # invalid UTF-8 replaced
    assert node.calls() == ["show job 42"]


def test_one_file_when_stdout_is_stderr(node: Node) -> None:
    log = node.files / "42.out"
    log.write_text("hello\n")
    node.answer(job_text(stdout=str(log)))
    (f,) = answer_of(node.run("job-log 42"))["files"]
    assert f["stream"] == "stdout+stderr" and f["tail"] == "hello\n"


def test_a_big_log_gives_whole_lines_within_max_bytes(node: Node) -> None:
    log = node.files / "42.out"
    with log.open("w") as fh:
        for i in range(20000):
            fh.write(f"step {i} loss {1 / (i + 1):.6f}\n")
        fh.write("Training finished\n")
    node.answer(job_text(stdout=str(log)))
    (f,) = answer_of(node.run("job-log 42 1024"))["files"]
    assert f["truncated"] is True and f["size"] == log.stat().st_size
    assert len(f["tail"].encode()) <= 1024 and f["tail"].endswith("step 19999 loss 0.000050\nTraining finished\n")
    assert f["tail"].startswith("step ")  # the partial first line is dropped


@pytest.mark.parametrize(("state", "why"), [("PENDING", "is PENDING"), ("REQUEUE_HOLD", "is REQUEUE_HOLD"),
                                            ("", "in no known state")])
def test_a_job_that_has_not_started_is_refused(node: Node, state: str, why: str) -> None:
    node.answer(job_text(state=state, stdout=str(node.files / "42.out")))
    res = node.run("job-log 42")
    assert res.returncode == 4 and why in one_line_error(res)


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "SUSPENDED", "COMPLETING"])
def test_ended_or_stopped_jobs_still_have_output(node: Node, state: str) -> None:
    log = node.files / "42.out"
    log.write_text("Traceback (most recent call last):\n")
    node.answer(job_text(state=state, stdout=str(log)))
    res = node.run("job-log 42")
    assert res.returncode == 0, res.stderr
    assert answer_of(res)["files"][0]["tail"].startswith("Traceback")


def test_unknown_job_and_silent_slurm_are_refused(node: Node) -> None:
    node.answer("slurm_load_jobs error: Invalid job id specified\n", rc=1)
    res = node.run("job-log 42")
    assert res.returncode == 4 and "Slurm does not know job 42" in one_line_error(res)
    node.answer("slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", rc=1)
    res = node.run("job-log 42")
    assert res.returncode == 4 and "cannot ask Slurm about job 42" in one_line_error(res)
    assert "Unable to contact slurm controller" in res.stderr
    node.answer(job_text("43", stdout="/etc/passwd"))  # Slurm answered about another job
    res = node.run("job-log 42")
    assert res.returncode == 4 and "no single record" in one_line_error(res)


def test_scontrol_missing_is_refused(node: Node) -> None:
    (node.dir / "scontrol").unlink()
    env = {"PATH": str(node.dir), "SSH_ORIGINAL_COMMAND": "job-log 42", "GPU_COST_NODE_NAME": "gpu01"}
    res = subprocess.run([sys.executable, str(WRAPPER)], env=env, capture_output=True, text=True, timeout=20)
    assert res.returncode == 4 and "scontrol: command not found" in one_line_error(res)


def test_a_job_of_another_node_is_refused(node: Node) -> None:
    log = node.files / "42.out"
    log.write_text("secret of gpu02\n")
    node.answer(job_text(batch_host="gpu02", stdout=str(log)))
    res = node.run("job-log 42", node_name="gpu01")
    assert res.returncode == 4 and "runs its batch script on gpu02, not on this node (gpu01)" in one_line_error(res)
    assert "secret" not in res.stdout
    assert node.calls() == ["show job 42"], "with GPU_COST_NODE_NAME the name is compared, nothing else"


def test_node_identity_from_the_host_name(node: Node) -> None:
    log = node.files / "42.out"
    log.write_text("hi\n")
    node.answer(job_text(batch_host=HOST, stdout=str(log)))
    assert node.run("job-log 42", node_name=None).returncode == 0
    # NodeName differs from the host name: Slurm's NodeHostName for it decides
    node.answer(job_text(batch_host="gpu07", stdout=str(log)),
                node=f"NodeName=gpu07 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.7 NodeHostName={HOST} Version=22.05\n")
    res = node.run("job-log 42", node_name=None)
    assert res.returncode == 0, res.stderr
    assert node.calls()[-1] == "-o show node gpu07"
    node.answer(job_text(batch_host="gpu07", stdout=str(log)),
                node="NodeName=gpu07 NodeAddr=10.0.0.7 NodeHostName=other-host Version=22.05\n")
    res = node.run("job-log 42", node_name=None)
    assert res.returncode == 4 and f"not on this node ({HOST})" in one_line_error(res)


def test_bad_node_name_override_is_refused(node: Node) -> None:
    node.answer(job_text(stdout="/etc/passwd"))
    res = node.run("job-log 42", node_name="gpu01;ls")
    assert res.returncode == 2 and "bad GPU_COST_NODE_NAME" in one_line_error(res)


def test_a_record_with_a_field_twice_is_refused(node: Node) -> None:
    node.answer(job_text(stdout="/etc/passwd", extra=f"   MailUser=x UserId=x({os.getuid()}) MailType=END\n"))
    res = node.run("job-log 42")
    assert res.returncode == 4 and "UserId= 2 times" in one_line_error(res)
    assert "root:" not in res.stdout


def test_interactive_allocation_has_no_output(node: Node) -> None:
    node.answer((DATA / "scontrol-job-salloc-22.05.txt").read_text())
    res = node.run("job-log 8")
    assert res.returncode == 4 and "names no output file for job 8" in one_line_error(res)


def test_a_symlink_is_refused_never_followed(node: Node) -> None:
    secret = node.files / "secret"
    secret.write_text("TOP SECRET\n")
    link = node.files / "42.out"
    link.symlink_to(secret)
    node.answer(job_text(stdout=str(link)))
    res = node.run("job-log 42")
    assert res.returncode == 0, res.stderr
    (f,) = answer_of(res)["files"]
    assert f == {"stream": "stdout+stderr", "path": str(link), "refused": "is a symbolic link: not following it"}
    assert "SECRET" not in res.stdout


def test_a_symlinked_directory_earlier_in_the_path_is_refused_never_followed(node: Node) -> None:
    """O_NOFOLLOW guards the last component only: every directory of the path is walked without links."""
    private = node.files / "private"
    private.mkdir(mode=0o700)
    (private / "42.out").write_text("BEHIND THE LINK\n")
    (node.files / "via").symlink_to(private, target_is_directory=True)
    node.answer(job_text(stdout=str(node.files / "via" / "42.out"), workdir=str(node.files / "via")))
    res = node.run("job-log 42")
    assert res.returncode == 0, res.stderr
    got = answer_of(res)
    why = f"{node.files / 'via'} in its path is a symbolic link: not following it"
    assert got["files"] == [{"stream": "stdout+stderr", "path": str(node.files / "via" / "42.out"), "refused": why}]
    # the WorkDir itself is the link here: refused as before, never scanned
    assert got["workdir"] == {"path": str(node.files / "via"), "refused": "is a symbolic link: not following it"}
    assert "BEHIND THE LINK" not in res.stdout
    # a link two levels up, and a WorkDir below a link
    (private / "sub").mkdir()
    (private / "sub" / "42.out").write_text("STILL BEHIND IT\n")
    node.answer(job_text(stdout=str(node.files / "via" / "sub" / "42.out"), workdir=str(node.files / "via" / "sub")))
    got = answer_of(node.run("job-log 42"))
    assert got["files"][0]["refused"] == why and got["workdir"]["refused"] == why
    assert "STILL BEHIND IT" not in json.dumps(got)
    # the same file by its real path is read
    node.answer(job_text(stdout=str(private / "sub" / "42.out"), workdir=str(private / "sub")))
    got = answer_of(node.run("job-log 42"))
    assert got["files"][0]["tail"] == "STILL BEHIND IT\n" and "refused" not in got["workdir"], got


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_a_file_of_another_uid_is_refused(node: Node) -> None:
    log = node.files / "42.out"
    log.write_text("not yours\n")
    os.chown(log, 65534, 65534)
    node.answer(job_text(stdout=str(log), uid=os.getuid()))
    (f,) = answer_of(node.run("job-log 42"))["files"]
    assert f["refused"] == f"owned by uid 65534, not the job's uid {os.getuid()}" and "tail" not in f


def test_not_regular_files_are_refused_without_blocking(node: Node) -> None:
    fifo = node.files / "42.out"
    os.mkfifo(fifo)
    node.answer(job_text(stdout=str(fifo), stderr="/dev/null"))
    started = time.monotonic()
    res = node.run("job-log 42", timeout=10)
    assert time.monotonic() - started < 8 and res.returncode == 0, res.stderr
    so, se = answer_of(res)["files"]
    assert so["refused"] == "not a regular file (a FIFO)" and se["refused"] == "not a regular file (a device)"
    node.answer(job_text(stdout=str(node.files)))
    assert answer_of(node.run("job-log 42"))["files"][0]["refused"] == "not a regular file (a directory)"
    node.answer(job_text(stdout="relative/42.out"))
    assert answer_of(node.run("job-log 42"))["files"][0]["refused"] == "not an absolute path"


def test_the_verb_writes_nothing(node: Node) -> None:
    log = node.files / "42.out"
    log.write_text("a\n")
    before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in node.files.iterdir()}
    node.answer(job_text(stdout=str(log)))
    assert node.run("job-log 42").returncode == 0
    assert {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in node.files.iterdir()} == before


# -- the WorkDir scan: metadata only, one level, bounded ------------------------------------------------


def _touch(path: Path, mtime: float, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def _workdir(node: Node) -> tuple[Path, Path, float]:
    """A job's working directory: its log, a config, a checkpoint being written, old outputs."""
    wd = node.files / "run dir"
    t = time.time()
    _touch(wd / "config.yaml", t - 7200)
    _touch(wd / "checkpoints" / "step_4000.pt", t - 600)
    _touch(wd / "checkpoints" / "step_5000.pt", t - 40)
    _touch(wd / "outputs" / "old.csv", t - 3600)
    _touch(wd / "outputs" / "deep" / "newer-but-two-levels-down.txt", t - 1)
    log = _touch(wd / "slurm-42.out", t - 5, "step 5000\n")  # the log: newest, and not counted
    return wd, log, t


def test_the_workdir_scan_reports_its_newest_file(node: Node) -> None:
    wd, log, t = _workdir(node)
    node.answer(job_text(stdout=str(log), workdir=str(wd)))
    res = node.run("job-log 42")
    assert res.returncode == 0, res.stderr
    got = answer_of(res)
    assert got["files"][0]["tail"] == "step 5000\n"
    w = got["workdir"]
    assert w == {"path": str(wd), "newest_mtime": pytest.approx(t - 40, abs=1e-3), "newest": "checkpoints/step_5000.pt",
                 "entries": 8, "truncated": False}  # 4 at the top, 2 + 2 one level down; deep/ is not entered


def test_the_workdir_scan_never_follows_a_symlink(node: Node) -> None:
    wd, log, t = _workdir(node)
    elsewhere = node.files / "elsewhere"
    _touch(elsewhere / "fresh.pt", t)
    (wd / "link.pt").symlink_to(elsewhere / "fresh.pt")
    (wd / "linked-dir").symlink_to(elsewhere, target_is_directory=True)
    (wd / "checkpoints" / "latest.pt").symlink_to(elsewhere / "fresh.pt")
    node.answer(job_text(stdout=str(log), workdir=str(wd)))
    w = answer_of(node.run("job-log 42"))["workdir"]
    assert w["newest"] == "checkpoints/step_5000.pt" and w["entries"] == 11
    # a WorkDir that is itself a symlink is refused, not followed
    link = node.files / "wd-link"
    link.symlink_to(wd, target_is_directory=True)
    node.answer(job_text(stdout=str(log), workdir=str(link)))
    res = node.run("job-log 42")
    assert res.returncode == 0, res.stderr
    assert answer_of(res)["workdir"] == {"path": str(link), "refused": "is a symbolic link: not following it"}


def test_the_workdir_scan_is_bounded(node: Node) -> None:
    wd = node.files / "many"
    wd.mkdir()
    for i in range(2100):
        (wd / f"f{i:05d}").touch()
    log = _touch(node.files / "42.out", time.time(), "x\n")
    node.answer(job_text(stdout=str(log), workdir=str(wd)))
    w = answer_of(node.run("job-log 42"))["workdir"]
    assert w["entries"] == 2000 and w["truncated"] is True and w["newest"].startswith("f")
    # the bound counts entries of the subdirectories too
    got, denied = node_action.scan_workdir(str(node.files), os.getuid(), max_entries=5)
    assert got["entries"] == 5 and got["truncated"] is True and denied is False
    got, _ = node_action.scan_workdir(str(wd), os.getuid(), max_entries=2100)
    assert got["entries"] == 2100 and got["truncated"] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_the_workdir_scan_counts_only_the_jobs_own_files(node: Node) -> None:
    wd, log, t = _workdir(node)
    theirs = _touch(wd / "checkpoints" / "someone-elses.pt", t)
    os.chown(theirs, 65534, 65534)
    os.utime(theirs, (t, t))
    node.answer(job_text(stdout=str(log), workdir=str(wd)))
    assert answer_of(node.run("job-log 42"))["workdir"]["newest"] == "checkpoints/step_5000.pt"
    node.answer(job_text(stdout=str(log), workdir=str(wd), uid=65534))  # the job of uid 65534: only that file
    w = answer_of(node.run("job-log 42"))["workdir"]
    assert w["newest"] == "checkpoints/someone-elses.pt"


@pytest.mark.parametrize(("workdir", "why"), [("missing", "does not exist"), ("42.out", "not a directory"),
                                              ("relative/dir", "not an absolute path"),
                                              ("(null)", "Slurm names no working directory")])
def test_a_workdir_that_cannot_be_scanned_is_refused_not_fatal(node: Node, workdir: str, why: str) -> None:
    log = _touch(node.files / "42.out", time.time(), "still read\n")
    path = str(node.files / workdir) if workdir in ("missing", "42.out") else workdir
    node.answer(job_text(stdout=str(log), workdir=path))
    res = node.run("job-log 42")
    assert res.returncode == 0, res.stderr
    got = answer_of(res)
    assert got["files"][0]["tail"] == "still read\n" and got["workdir"] == {"path": path, "refused": why}


def test_the_workdir_scan_writes_nothing(node: Node) -> None:
    wd, log, _ = _workdir(node)
    before = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in wd.rglob("*")}
    node.answer(job_text(stdout=str(log), workdir=str(wd)))
    assert node.run("job-log 42").returncode == 0
    assert {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in wd.rglob("*")} == before


# -- the job's own processes: CPU and I/O over a one-second sample ------------------------------------


def _unique_job_id(n: int) -> str:
    """A job id no real job on this host has (the pytest process's pid in it)."""
    return f"8{os.getpid() % 10_000_000:07d}{n}"


def _full_priority() -> None:
    """A child's niceness back to 0 where allowed (root): the test runs under `nice -n 19` next to other load."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass


BUSY = [sys.executable, "-c", "while True: pass"]


@pytest.fixture
def spawn() -> Any:
    """Start processes with a given Slurm job id in their environment; killed at the end of the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], job_id: str | None = None, var: str = "SLURM_JOB_ID", **extra: str) -> int:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        if job_id is not None:
            env[var] = job_id
        env.update(extra)
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=_full_priority)
        procs.append(p)
        return p.pid

    yield start
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=10)


def test_activity_counts_the_cpu_of_the_jobs_busy_processes(spawn: Any) -> None:
    jid = _unique_job_id(1)
    busy = [spawn(BUSY, jid), spawn(BUSY, jid, var="SLURM_JOBID")]  # the older name too
    idle = spawn(["sleep", "60"], jid)
    time.sleep(0.2)
    assert sorted(node_action.job_processes(jid, os.getuid())[0]) == sorted([*busy, idle])
    started = time.monotonic()
    got, denied = node_action.job_activity(jid, os.getuid())
    assert 0.95 <= time.monotonic() - started < 5 and denied is False
    assert got["pids"] == 3 and got["cpu_cores"] > 0.5, got
    assert 0.99 <= got["sampled_s"] < 3 and got["io_bps"] >= 0 and "truncated" not in got


def test_activity_of_a_sleeping_job_is_near_zero(spawn: Any) -> None:
    jid = _unique_job_id(2)
    spawn(["sleep", "60"], jid)
    spawn(["sleep", "60"], jid)
    time.sleep(0.2)
    got, _ = node_action.job_activity(jid, os.getuid())
    assert got["pids"] == 2 and got["cpu_cores"] < 0.1 and got["io_bps"] < 1024 and got["sampled_s"] >= 0.99, got


def test_activity_counts_no_process_of_another_job(spawn: Any) -> None:
    jid = _unique_job_id(3)
    sleep = ["sleep", "60"]
    spawn(sleep, jid + "0")  # a longer id that starts with this one
    spawn(sleep, jid[:-1])  # a shorter one
    spawn(sleep, None, NOTE=f"SLURM_JOB_ID={jid}")  # the text in another variable
    spawn(sleep, None, SLURM_ARRAY_JOB_ID=jid)  # an array's id is not the task's job id
    time.sleep(0.2)
    assert node_action.job_processes(jid, os.getuid())[0] == []
    got, _ = node_action.job_activity(jid, os.getuid())
    assert got == {"pids": 0, "cpu_cores": 0.0, "io_bps": 0.0, "sampled_s": 0.0}  # nothing to sample: no sleep
    # the job's processes are those of the job's uid: another uid's are not looked at
    spawn(sleep, jid)
    time.sleep(0.2)
    assert len(node_action.job_processes(jid, os.getuid())[0]) == 1
    assert node_action.job_processes(jid, os.getuid() + 12345)[0] == []


def test_activity_counts_the_reads_and_writes(spawn: Any) -> None:
    jid = _unique_job_id(4)
    spawn(["dd", "if=/dev/zero", "of=/dev/null", "bs=1M"], jid)
    time.sleep(0.2)
    got, _ = node_action.job_activity(jid, os.getuid())
    assert got["pids"] == 1 and got["io_bps"] > 10 * 1048576, got


def test_activity_finds_a_job_cgroup_too(spawn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    jid = _unique_job_id(5)
    pid = spawn(["sleep", "60"])  # no SLURM_JOB_ID: only its cgroup names the job
    real = node_action.slurm_job_of
    monkeypatch.setattr(node_action, "slurm_job_of", lambda p: jid if p == pid else real(p))
    assert node_action.job_processes(jid, os.getuid())[0] == [pid]
    assert node_action.JOB_RE.search(f"0::/system.slice/slurmstepd.scope/job_{jid}/step_batch").group(1) == jid


def test_a_process_gone_between_the_looks_is_left_out(spawn: Any) -> None:
    jid = _unique_job_id(6)
    spawn(["sleep", "60"], jid)
    short = spawn(["sleep", "60"], jid)
    time.sleep(0.2)
    first = node_action.activity_start(jid, os.getuid())
    assert len(first["counters"]) == 2
    os.kill(short, 9)  # not reaped: a zombie now, which is gone all the same
    got = node_action.activity_finish(first, 0.3)
    assert got["pids"] == 1 and 0.29 <= got["sampled_s"] < 2, got


def test_io_that_cannot_be_read_is_unknown_not_zero(spawn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    jid = _unique_job_id(12)
    spawn(["sleep", "60"], jid)
    time.sleep(0.2)
    real = node_action.proc_counters

    def no_io(pid: int) -> Any:
        got = real(pid)
        return None if got is None else (got[0], got[1], None)  # /proc/<pid>/io is another user's

    monkeypatch.setattr(node_action, "proc_counters", no_io)
    got, _ = node_action.job_activity(jid, os.getuid(), 0.2)
    assert got["pids"] == 1 and got["io_bps"] is None and got["cpu_cores"] < 0.5, got


def test_activity_scan_is_bounded(spawn: Any) -> None:
    jid = _unique_job_id(7)
    spawn(["sleep", "60"], jid)
    time.sleep(0.2)
    pids, _, truncated = node_action.job_processes(jid, os.getuid(), max_pids=1)
    assert truncated is True and len(pids) <= 1
    assert node_action.ACTIVITY_MAX_PIDS == 4096 and node_action.ACTIVITY_SAMPLE_S == 1.0


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(), reason="running as nobody needs root")
def test_activity_unreadable_processes_are_reported_as_hidden(spawn: Any) -> None:
    jid = _unique_job_id(8)
    spawn(["sleep", "60"], jid)
    time.sleep(0.2)
    code = ("import importlib.machinery, importlib.util, json, sys\n"
            "l = importlib.machinery.SourceFileLoader('w', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(importlib.util.spec_from_loader('w', l)); l.exec_module(m)\n"
            "print(json.dumps(m.job_processes(sys.argv[2], 0)))\n")
    res = subprocess.run(["/usr/bin/python3", "-c", code, str(WRAPPER), jid], capture_output=True, text=True,
                         timeout=30, user="nobody", cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [[], True, False]  # root's environments: nothing seen, hidden by permissions


def test_the_verb_reports_the_jobs_activity(node: Node, spawn: Any) -> None:
    jid = _unique_job_id(9)
    spawn(BUSY, jid)
    spawn(BUSY, jid)
    log = _touch(node.files / f"{jid}.out", time.time(), "loading data\n")
    node.answer(job_text(jid, stdout=str(log)))
    time.sleep(0.2)
    res = node.run(f"job-log {jid}", preexec_fn=_full_priority)  # not starved by the busy children
    assert res.returncode == 0, res.stderr
    got = answer_of(res)
    assert got["files"][0]["tail"] == "loading data\n"
    act = got["activity"]
    assert act["pids"] == 2 and act["cpu_cores"] > 0.5 and act["sampled_s"] >= 0.99, act
    assert set(act) == {"pids", "cpu_cores", "io_bps", "sampled_s"}
    # what the agent keeps of it
    parsed = parse_job_log(res.stdout, "gpu01", jid)
    assert parsed["cpu_cores"] == act["cpu_cores"] and parsed["io_bps"] == act["io_bps"]


def test_the_verb_samples_an_array_tasks_own_job_id(node: Node, spawn: Any) -> None:
    own, array = _unique_job_id(10), _unique_job_id(11)
    spawn(["sleep", "60"], own, SLURM_ARRAY_JOB_ID=array, SLURM_ARRAY_TASK_ID="1")
    spawn(BUSY, array)  # not the task: the array's own first job, say
    log = _touch(node.files / f"{array}_1.out", time.time(), "task 1\n")
    text = job_text(own, stdout=str(log)).replace(f"JobId={own} ", f"JobId={own} ArrayJobId={array} ArrayTaskId=1 ", 1)
    node.answer(text)
    time.sleep(0.2)
    res = node.run(f"job-log {array}_1", preexec_fn=_full_priority)
    assert res.returncode == 0, res.stderr
    act = answer_of(res)["activity"]
    assert act["pids"] == 1 and act["cpu_cores"] < 0.1, act


def test_a_failing_sample_never_fails_the_verb(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _touch(node.files / "42.out", time.time(), "still read\n")
    monkeypatch.setattr(node_action, "run", lambda argv, timeout=30.0: {"rc": 0, "stdout": job_text(stdout=str(log)),
                                                                        "stderr": ""})
    monkeypatch.setenv("GPU_COST_NODE_NAME", "gpu01")

    def boom(*args: object, **kw: object) -> dict:
        raise OSError("no /proc here")

    monkeypatch.setattr(node_action, "activity_start", boom)
    got = node_action.job_log(["42"])
    assert got["files"][0]["tail"] == "still read\n"
    assert got["activity"] == {"refused": "cannot look at the job's processes: no /proc here"}
    monkeypatch.setattr(node_action, "activity_start", lambda job_id, uid: {"t": 0.0, "counters": {1: (0, 0, 0)},
                                                                             "denied": False, "truncated": False})
    monkeypatch.setattr(node_action, "activity_finish", boom)
    assert node_action.job_log(["42"])["activity"] == {"refused": "cannot look at the job's processes: no /proc here"}


# -- the agent's side: NodeSource.job_log ----------------------------------------------------------------


class FakeRunner:
    def __init__(self, rc: int = 0, stdout: str = "", stderr: str = "", boom: Exception | None = None) -> None:
        self.rc, self.stdout, self.stderr, self.boom = rc, stdout, stderr, boom
        self.argv: list[list[str]] = []

    def run(self, argv, *, timeout: float = 30.0, stdin: str | None = None) -> Completed:  # type: ignore[no-untyped-def]
        self.argv.append(list(argv))
        if self.boom is not None:
            raise self.boom
        return Completed(tuple(argv), self.rc, self.stdout, self.stderr)


def source(runner: FakeRunner) -> NodeSource:
    return NodeSource(NodeAccess(command=("gpu-cost-node-action",)), runner_for=lambda node: runner)


def answer(*files: dict[str, Any]) -> str:
    return json.dumps({"verb": "job-log", "job_id": "42", "job_state": "RUNNING", "batch_host": "gpu01",
                       "files": list(files), "ok": True})


OUT = {"stream": "stdout", "path": "/j/42.out", "size": 3000, "mtime": 1000.0, "tail": "epoch 9\n", "truncated": True}
ERR = {"stream": "stderr", "path": "/j/42.err", "size": 20, "mtime": 1500.5, "tail": "warn", "truncated": False}


def test_job_log_good_answer() -> None:
    runner = FakeRunner(stdout=answer(ERR, OUT))
    got = source(runner).job_log("gpu01", "42", 4096)
    assert runner.argv == [["gpu-cost-node-action", "job-log", "42", "4096"]]
    assert got == {"path": "/j/42.out", "size": 3020, "mtime": 1500.5, "text": "epoch 9\nwarn", "files": [ERR, OUT],
                   "workdir_mtime": None, "workdir_newest": None, "cpu_cores": None, "io_bps": None,
                   "error": None}  # an older wrapper: no scan, no sample


def test_job_log_reports_the_workdirs_newest_file() -> None:
    scan = {"path": "/j", "newest_mtime": 1490.0, "newest": "checkpoints/step_5000.pt", "entries": 12,
            "truncated": False}
    text = json.dumps({**json.loads(answer(OUT)), "workdir": scan})
    got = source(FakeRunner(stdout=text)).job_log("gpu01", "42")
    assert got["workdir_mtime"] == 1490.0 and got["workdir_newest"] == "checkpoints/step_5000.pt"
    assert got["error"] is None and got["text"] == "epoch 9\n"
    refused = json.dumps({**json.loads(answer(OUT)), "workdir": {"path": "/j", "refused": "does not exist"}})
    got = source(FakeRunner(stdout=refused)).job_log("gpu01", "42")
    assert got["workdir_mtime"] is None and got["workdir_newest"] is None
    empty = json.dumps({**json.loads(answer(OUT)), "workdir": {**scan, "newest_mtime": None, "newest": None}})
    assert source(FakeRunner(stdout=empty)).job_log("gpu01", "42")["workdir_mtime"] is None
    # the log refused, the directory seen: the evidence of the file still comes back
    no_log = {"stream": "stdout+stderr", "path": "/j/42.out", "refused": "permission denied"}
    text = json.dumps({**json.loads(answer(no_log)), "workdir": scan})
    got = source(FakeRunner(stdout=text)).job_log("gpu01", "42")
    assert got["error"].startswith("gpu01: job 42's log not read") and got["workdir_mtime"] == 1490.0


def test_job_log_keeps_the_processes_cpu_and_io() -> None:
    def with_activity(activity: object, *files: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps({**json.loads(answer(*(files or (OUT,)))), "activity": activity})
        return source(FakeRunner(stdout=text)).job_log("gpu01", "42")

    got = with_activity({"pids": 3, "cpu_cores": 1.3, "io_bps": 83886080.0, "sampled_s": 1.002})
    assert got["cpu_cores"] == 1.3 and got["io_bps"] == 83886080.0 and got["error"] is None
    assert got["text"] == "epoch 9\n"
    for refused in ({"refused": "permission denied (no root copy: sudo -n: a password is required)"},
                    {"pids": 0, "cpu_cores": 0.0, "io_bps": 0.0, "sampled_s": 0.0},  # no process seen
                    {"pids": 2, "cpu_cores": "lots", "io_bps": float("nan")}, {"pids": True, "cpu_cores": 1.0},
                    {"pids": 1, "cpu_cores": -1, "io_bps": float("inf")}, "busy", None):
        got = with_activity(refused)
        assert got["cpu_cores"] is None and got["io_bps"] is None, refused
    # the log refused, the processes seen: their evidence still comes back
    no_log = {"stream": "stdout+stderr", "path": "/j/42.out", "refused": "permission denied"}
    got = with_activity({"pids": 1, "cpu_cores": 0.9, "io_bps": 0, "sampled_s": 1.0}, no_log)
    assert got["error"].startswith("gpu01: job 42's log not read") and got["cpu_cores"] == 0.9 and got["io_bps"] == 0.0


def test_job_log_one_file_and_a_refused_one() -> None:
    both = {**OUT, "stream": "stdout+stderr", "tail": "no newline at the end"}
    got = source(FakeRunner(stdout=answer(both))).job_log("gpu01", "42")
    assert got["text"] == "no newline at the end" and got["path"] == "/j/42.out" and got["error"] is None
    refused = {"stream": "stderr", "path": "/j/42.err", "refused": "is a symbolic link: not following it"}
    got = source(FakeRunner(stdout=answer(OUT, refused))).job_log("gpu01", "42")
    assert got["text"] == "epoch 9\n" and got["size"] == 3000 and got["files"][1] == refused and got["error"] is None


def test_job_log_every_file_refused_is_an_error() -> None:
    refused = {"stream": "stdout+stderr", "path": "/j/42.out", "refused": "owned by uid 0, not the job's uid 1000"}
    got = source(FakeRunner(stdout=answer(refused))).job_log("gpu01", "42")
    assert got["error"] == "gpu01: job 42's log not read: stdout+stderr /j/42.out: owned by uid 0, not the job's uid 1000"
    assert "text" not in got


def test_job_log_redacts_credentials() -> None:
    leaky = {**OUT, "tail": "connecting to postgresql://bob:hunter2@db/x\nTraining finished\n"}
    got = source(FakeRunner(stdout=answer(leaky))).job_log("gpu01", "42")
    assert "hunter2" not in got["text"] and "Training finished" in got["text"]
    assert "hunter2" not in json.dumps(got["files"])


@pytest.mark.parametrize(("runner", "expected"), [
    (FakeRunner(rc=4, stdout='{"ok": false}', stderr="gpu-cost-node-action: job 42 runs its batch script on gpu02, "
                "not on this node (gpu01): not reading its output\n"),
     "gpu01: job-log 42 exited 4: job 42 runs its batch script on gpu02, not on this node (gpu01): not reading its output"),
    (FakeRunner(rc=255, stderr="ssh to 10.0.0.1 failed: NoValidConnectionsError: Unable to connect\nmore\n"),
     "gpu01: job-log 42 exited 255: ssh to 10.0.0.1 failed: NoValidConnectionsError: Unable to connect more"),
    (FakeRunner(rc=2, stdout="", stderr="gpu-cost-node-action: refused: 'job-log' is not an allowed verb\n"),
     "gpu01: job-log 42 exited 2: refused: 'job-log' is not an allowed verb"),
    (FakeRunner(stdout="Welcome to gpu01!\n"), "gpu01: job-log did not answer JSON (line 1): "),
    (FakeRunner(stdout='{"verb": "inspect"}'), "gpu01: job-log answered something else: "),
    (FakeRunner(stdout=answer({"stream": "stdout", "path": "/j", "size": 1})),
     "gpu01: job-log gave '/j' without a tail"),
    (FakeRunner(boom=RuntimeError("paramiko\nexploded")), "gpu01: job-log 42: paramiko exploded"),
], ids=["refused", "ssh-failed", "old-wrapper", "not-json", "other-verb", "no-tail", "runner-raises"])
def test_job_log_failures_never_raise(runner: FakeRunner, expected: str) -> None:
    got = source(runner).job_log("gpu01", "42")
    assert set(got) == {"error"} and got["error"].startswith(expected), got
    assert "\n" not in got["error"]


def test_job_log_keeps_max_bytes_within_the_wrappers_bounds() -> None:
    runner = FakeRunner(stdout=answer(OUT))
    source(runner).job_log("gpu01", "42", 1_048_576)
    source(runner).job_log("gpu01", "42", 10)
    assert [a[-1] for a in runner.argv] == ["65536", "512"]


def test_parse_job_log_direct() -> None:
    assert parse_job_log(answer(OUT), "gpu01", "42")["text"] == "epoch 9\n"


def _job(job_id: str, nodes: tuple[str, ...] = (), alloc: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> Job:
    return Job(job_id=job_id, user="u", state="RUNNING", nodes=nodes, gpu_alloc=alloc)


def test_job_node() -> None:
    assert job_node(_job("1", ("gpu03", "gpu04"), (("gpu04", (0,)),))) == "gpu03"
    assert job_node(_job("1", (), (("gpu04", (0,)),))) == "gpu04"
    assert job_node(_job("1")) is None


def test_job_logs_reads_each_job_on_its_node_in_parallel() -> None:
    import threading

    seen: list[tuple[str, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(3, timeout=10)  # three reads at once, or this times out

    class PerNode(FakeRunner):
        def __init__(self, node: str) -> None:
            super().__init__()
            self.node = node

        def run(self, argv, *, timeout: float = 30.0, stdin: str | None = None) -> Completed:  # type: ignore[no-untyped-def]
            with lock:
                seen.append((self.node, argv[2]))
            barrier.wait()
            if self.node == "gpu09":
                return Completed(tuple(argv), 4, "", "gpu-cost-node-action: Slurm does not know job 3\n")
            return Completed(tuple(argv), 0, answer({**OUT, "tail": f"log of {argv[2]} on {self.node}\n"}), "")

    ns = NodeSource(NodeAccess(), runner_for=PerNode)
    jobs = [_job("1", ("gpu01",)), _job("2_5", (), (("gpu02", (1,)),)), _job("3", ("gpu09",)), _job("4"), _job("1", ("gpu01",))]
    logs = ns.job_logs(jobs, 2048)
    assert sorted(seen) == [("gpu01", "1"), ("gpu02", "2_5"), ("gpu09", "3")]
    assert logs["1"]["text"] == "log of 1 on gpu01\n" and logs["2_5"]["text"] == "log of 2_5 on gpu02\n"
    assert logs["3"] == {"error": "gpu09: job-log 3 exited 4: Slurm does not know job 3"}
    assert logs["4"] == {"error": "job 4: no node known to read its log on"}
    assert ns.job_logs([], 2048) == {}


# -- Slurm's batch flag -------------------------------------------------------------------------------


def test_batch_flag_from_captured_squeue() -> None:
    # captured from the 22.05 test cluster: an sbatch job and `salloc --no-shell -J interactive`
    doc = json.loads((DATA / "squeue-22.05-interactive.json").read_text())
    jobs = {j.job_id: j for j in parse_jobs(doc)}
    assert jobs["1"].batch is True
    assert jobs["8"].batch is False and jobs["8"].name == "interactive" and jobs["8"].gpu_alloc == (("gpu01", (1,)),)
    assert all(j.batch is True for j in parse_jobs(json.loads((DATA / "squeue-22.05.json").read_text())))
    assert all(j.batch is True for j in parse_jobs(json.loads((DATA / "squeue-24.05.json").read_text())))


@pytest.mark.parametrize(("value", "expected"), [(True, True), (False, False), (1, True), (0, False), ("yes", None),
                                                 (None, None), ("absent", None)])
def test_batch_flag_shapes(value: object, expected: bool | None) -> None:
    doc = json.loads((DATA / "squeue-22.05-interactive.json").read_text())
    row = doc["jobs"][0]
    if value == "absent":
        row.pop("batch_flag")
    else:
        row["batch_flag"] = value
    assert parse_jobs({"jobs": [row]})[0].batch is expected


# -- the live snapshot reads the logs of the jobs that look idle -------------------------------------------


class StubPrometheus:
    queries_made = 0

    def __init__(self, frame: Any) -> None:
        self.frame = frame

    def gpu_frame(self, policy: Any, now: float) -> tuple[Any, dict[float, Any]]:
        return self.frame.copy(), {}

    def node_stats(self, policy: Any, now: float) -> dict[str, dict[str, float]]:
        return {}


class StubSlurm:
    def __init__(self, snap: Any) -> None:
        self.snap = snap

    def jobs(self) -> list[Job]:
        return list(self.snap.jobs)

    def nodes(self) -> list[Any]:
        return list(self.snap.nodes)

    def reservations(self) -> list[Any]:
        return []


class StubNodes:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[tuple[list[str], int]] = []

    def processes(self, hosts: Any) -> tuple[list[Any], list[str]]:
        return [], []

    def job_logs(self, jobs: Any, max_bytes: int) -> dict[str, dict[str, Any]]:
        jobs = list(jobs)
        self.asked.append(([j.job_id for j in jobs], max_bytes))
        if self.fail:
            raise RuntimeError("the SSH pool is gone")
        return {j.job_id: {"error": f"{job_node(j)}: job-log {j.job_id} exited 4: refused"} for j in jobs}


def _live(policy: Any, scenario: Any, nodes: StubNodes, **kw: Any) -> Any:
    from gpu_cost.perceive import live
    from gpu_cost.sim import cluster as sim
    from tests.fixtures.core import NOW

    base = sim.snapshot(policy, NOW, scenario)
    raw = base.gpus.drop(columns=["job_id", "attribution"])
    return live.snapshot(policy, NOW, prometheus=StubPrometheus(raw), slurm=StubSlurm(base), node_source=nodes, **kw)


def test_live_snapshot_reads_the_logs_of_idle_jobs(policy, scenario) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.perceive import live

    nodes = StubNodes()
    snap = _live(policy, scenario, nodes)
    expected = [j.job_id for j in live.log_candidates(snap, policy)]
    assert expected and nodes.asked == [(expected, policy.evidence.job_log.max_bytes)]
    assert sorted(snap.job_logs) == sorted(expected) and all(v["error"] for v in snap.job_logs.values())
    assert not [p for p in snap.problems if "log" in p], "an unreadable log is not a problem of the snapshot"


def test_live_snapshot_a_failing_log_reader_degrades_nothing(policy, scenario) -> None:  # type: ignore[no-untyped-def]
    good = _live(policy, scenario, StubNodes())
    bad = _live(policy, scenario, StubNodes(fail=True))
    assert bad.job_logs == {} and bad.problems == good.problems


def test_live_snapshot_no_logs_when_off(policy, scenario) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    nodes = StubNodes()
    _live(policy, scenario, nodes, processes=False)
    off = dataclasses.replace(policy, evidence=dataclasses.replace(
        policy.evidence, job_log=dataclasses.replace(policy.evidence.job_log, enabled=False)))
    snap = _live(off, scenario, nodes)
    assert nodes.asked == [] and snap.job_logs == {}
