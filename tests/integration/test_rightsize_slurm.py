"""The shipped ``include/slurm/cli_filter.lua`` on the real Slurm 22.05: ``sbatch`` shows the advice the
agent computed from a user's history, submits the job as asked, refuses only when the policy blocks, and
says nothing (and submits) without an advice file or with a broken one.

The session cluster stays as it is: cli_filter runs inside sbatch, so a submit host is a folder with
the cluster's slurm.conf plus ``CliFilterPlugins=cli_filter/lua`` and the script beside it, and only
the sbatch calls given that ``SLURM_CONF`` load the plugin (as a login node's own copy would).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.capacity import rightsize
from gpu_cost.config.schema import Policy
from tests.fixtures.core import NOW, ROOT
from tests.unit.test_rightsize import H, history, still_running

pytestmark = pytest.mark.integration


@dataclasses.dataclass
class Login:
    """A submit host's configuration folder and the environment that makes sbatch read it."""

    etc: Path
    env: dict[str, str]
    jobs: Path

    @property
    def advice(self) -> Path:
        return self.etc / "gpu-cost-advice.tsv"

    def sbatch(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sbatch", "--parsable", f"--chdir={self.jobs}", f"--output={self.jobs}/%j.out", *args],
                              input="#!/bin/bash\nsleep 30\n", env=self.env, capture_output=True, text=True,
                              timeout=60, check=False)


@pytest.fixture
def login(slurm_cluster: Any, tmp_path: Path) -> Iterator[Login]:
    etc = tmp_path / "login-etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(slurm_cluster.conf.read_text() + "\nCliFilterPlugins=cli_filter/lua\n")
    shutil.copy(ROOT / "include" / "slurm" / "cli_filter.lua", etc / "cli_filter.lua")
    yield Login(etc, {**slurm_cluster.env, "SLURM_CONF": str(etc / "slurm.conf")}, slurm_cluster.root / "jobs")
    slurm_cluster.cancel_all()


@pytest.fixture
def store() -> AuditStore:
    """root's history: six sweeps of a learning-rate search on 8 GPUs that kept one busy for an hour of
    the day they asked, and six pre-training runs that used all 4 of theirs within a tight limit."""
    s = AuditStore("sqlite:///:memory:").ensure_schema()
    history(s, 6, user="root", name="sweep-lr0.{i}-3f9a2c", gpus=8, needs=[1] * 12)
    history(s, 6, first=6, user="root", name="big-{i}", gpus=4, needs=[4] * 12, limit=2 * H)
    still_running(s)
    return s


def policy(**knobs: Any) -> Policy:
    base = Policy()
    return dataclasses.replace(base, rightsize=dataclasses.replace(base.rightsize, **knobs))


def accepted(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    assert job_id.isdigit(), res.stdout
    return job_id


def test_sbatch_shows_the_advice_and_submits_as_asked(login: Login, store: AuditStore, slurm_cluster: Any) -> None:
    # no advice file yet: silent
    res = login.sbatch("--gpus=8", "-J", "sweep-lr0.05-77ab09")
    accepted(res)
    assert "gpu-cost" not in res.stderr

    rightsize.publish(store, policy(), NOW, out=login.advice)
    res = login.sbatch("--gpus=8", "--time=1-00:00:00", "-J", "sweep-lr0.05-77ab09")
    job = accepted(res)
    lines = res.stderr.splitlines()
    assert lines[0] == 'sbatch: gpu-cost: advice for root\'s jobs named like "sweep-lr#.#-#" (6 finished in the last 30d):'
    assert any(ln.startswith("sbatch: gpu-cost:   GPUs:") and "(--gpus=1)" in ln for ln in lines), res.stderr
    assert any(ln.startswith("sbatch: gpu-cost:   time:") and "--time=1:30:00" in ln for ln in lines), res.stderr
    assert lines[-1] == "sbatch: gpu-cost: advice only: the job is submitted as asked."
    assert slurm_cluster.job_state(job) in ("PENDING", "RUNNING")
    print(res.stderr)  # what a user sees (pytest -s)

    # the same class through --gres on two nodes (4 + 4 GPUs), within the advised time: GPUs only
    res = login.sbatch("-N", "2", "--gres=gpu:4", "--time=1:00:00", "-J", "sweep-lr0.5-00aa11")
    accepted(res)
    assert "(--gpus=1)" in res.stderr and "time:" not in res.stderr

    # as advised; a class that uses its GPUs (its user's advice is not its own): silent
    for args in (("--gpus=1", "--time=1:30:00", "-J", "sweep-lr0.01-abcd12"), ("--gpus=4", "-J", "big-12"),
                 ("--gpus=8", "-J", "big-13")):
        res = login.sbatch(*args)
        accepted(res)
        assert "gpu-cost" not in res.stderr, (args, res.stderr)
    # --quiet silences the advice (and sbatch's own job id)
    res = login.sbatch("--quiet", "--gpus=8", "-J", "sweep-lr0.05-77ab09")
    assert (res.returncode, res.stderr) == (0, "")

    # any other job of root's: the user's advice (half of root's 8- and 4-GPU jobs needed 4)
    res = login.sbatch("--gpus=8", "-J", "notebook")
    accepted(res)
    assert "advice for root's GPU jobs" in res.stderr and "(--gpus=4)" in res.stderr


@pytest.mark.parametrize("content", ["", "not the agent's file\nuser\troot\n",
                                     rightsize.FILE_MAGIC + "\nuser\troot\t\t2\n\x00\xff garbage\tx\n"],
                         ids=["empty", "foreign", "truncated"])
def test_a_broken_advice_file_never_breaks_sbatch(login: Login, content: str) -> None:
    login.advice.write_bytes(content.encode("latin-1"))
    res = login.sbatch("--gpus=8", "-J", "sweep-lr0.05-77ab09")
    accepted(res)
    assert "gpu-cost" not in res.stderr


def test_block_refuses_a_far_bigger_request(login: Login, store: AuditStore, slurm_cluster: Any) -> None:
    rightsize.publish(store, policy(block=True, block_factor=4), NOW, out=login.advice)
    before = slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    res = login.sbatch("--gpus=8", "-J", "sweep-lr0.05-77ab09")
    assert res.returncode != 0 and not res.stdout.strip()
    assert ("sbatch: error: gpu-cost: refused by the site's GPU policy: more than 4 GPU(s) for these jobs"
            in res.stderr), res.stderr
    assert "cli_filter plugin terminated with error" in res.stderr
    assert slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split() == before
    print(res.stderr)
    # up to the limit it is advice again
    res = login.sbatch("--gpus=4", "-J", "sweep-lr0.05-77ab09")
    accepted(res)
    assert "(--gpus=1)" in res.stderr and "refused" not in res.stderr


NAMES = ["Train_0042-3f9a2c", "llama7b-endpoint-3f9a2c", "run.2024-01-05", "eval@v2+cafe", "a1b2", "deadbeef",
         "x 12 y", "lr0.001", "job", "ABC-DEF-0x1f", "sweep/seed:7"]


def test_the_lua_stem_is_the_agents(login: Login) -> None:
    """Each name finds its own class row only if the script strips it as gpu_cost.analyse.baselines.name_stem does."""
    from gpu_cost.analyse.baselines import name_stem

    stems = [name_stem(n) for n in NAMES]
    assert len(set(stems)) == len(stems)
    rows = [f"class\troot\t{stem}\t2\t1\t0\t0\t0\tclass {i}\tGPUs: one\t\t" for i, stem in enumerate(stems)]
    login.advice.write_text("\n".join([rightsize.FILE_MAGIC, *rows, "user\troot\t\t2\t1\t0\t0\t0\tthe user's\tGPUs\t\t"])
                            + "\n")
    for i, name in enumerate(NAMES):
        res = login.sbatch("--gpus=2", "-J", name)
        accepted(res)
        assert f"sbatch: gpu-cost: class {i}\n" in res.stderr, (name, stems[i], res.stderr)
