"""Slurm actions on the real test cluster: demote, the cancel ladder, gone jobs, dry-run, permissions."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gpu_cost.act.base import ActionContext
from gpu_cost.act.dispatch import execute
from gpu_cost.act.slurm import cancel, demote, hold, terminate
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Decision
from gpu_cost.perceive.runner import Completed, LocalRunner

pytestmark = pytest.mark.integration

NAME = "eval; echo pwned > /tmp/x `id` $(id) 'a' \"b\" ∑ café"


def decision(job_id: str, action: str, mode: str = "enforce") -> Decision:
    return Decision(decision_id=f"t-{action}-{job_id}", ts=time.time(), rule="idle_allocation", target_kind="job",
                    target=f"job:{job_id}", action=action, mode=mode, job_id=job_id, user="root", gpus=1)


def ctx(cluster, *, dry_run: bool = False, grace: float = 60.0, runner=None) -> ActionContext:
    return ActionContext(policy=Policy(), dry_run=dry_run, now=time.time(), run_id="test", slurm=runner or cluster.runner,
                         sleep=time.sleep, extra={"grace_s": grace})


def squeue(cluster, job_id: str, fmt: str) -> str:
    return cluster.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", fmt).stdout.strip()


@pytest.fixture
def clean(slurm_cluster):
    yield slurm_cluster
    slurm_cluster.cancel_all()


def test_demote_then_cancel_through_the_audit_trail(clean, store) -> None:
    c = clean
    jid = c.submit("sleep 300", f"--job-name={NAME}", "--gres=gpu:1")
    c.wait_state(jid, "RUNNING", 30)
    assert squeue(c, jid, "%y") == "0"
    results = execute([decision(jid, "demote")], ctx(c), store)
    assert results[0]["status"] == "succeeded", results
    assert squeue(c, jid, "%y") == str(Policy().demote.nice)  # the nice value is visible in squeue
    assert squeue(c, jid, "%j") == NAME  # the name came through unharmed
    rows = store.actions_of_decision(f"t-demote-{jid}")
    assert rows[0]["status"] == "succeeded" and "scontrol update jobid=" in rows[0]["output"]
    out = execute([decision(jid, "terminate")], ctx(c), store)
    assert out[0]["status"] == "succeeded"
    c.wait_state(jid, ("CANCELLED", "COMPLETED", "FAILED", "GONE"), 30)


def test_cancel_ladder_term_is_enough_for_a_job_that_traps_it(clean) -> None:
    c = clean
    jid = c.submit("trap 'echo got TERM; exit 0' TERM\nsleep 300 &\nwait", "--job-name=polite")
    c.wait_state(jid, "RUNNING", 30)
    out = cancel(decision(jid, "cancel"), ctx(c, grace=20))
    assert out.status == "succeeded" and out.output.startswith("gone after TERM"), out
    assert out.details["signal"] == "TERM"
    assert "got TERM" in (c.root / "jobs" / f"{jid}.out").read_text()


def test_cancel_ladder_kills_a_job_that_ignores_term(clean) -> None:
    c = clean
    jid = c.submit("trap '' TERM\nsleep 300", "--job-name=stubborn")
    c.wait_state(jid, "RUNNING", 30)
    out = cancel(decision(jid, "cancel"), ctx(c, grace=3))
    assert out.status == "succeeded" and out.output.startswith("gone after KILL"), out
    assert "--signal=KILL" in out.command and out.details["waited_s"] >= 3
    assert c.job_state(jid) in ("COMPLETING", "CANCELLED", "FAILED", "GONE")


def test_finished_or_unknown_job_is_a_noop_success(clean) -> None:
    c = clean
    jid = c.submit("exit 0", "--job-name=done-already")
    c.wait_state(jid, ("COMPLETED", "GONE"), 30)
    for fn in (cancel, terminate, demote, hold):
        out = fn(decision(jid, fn.__name__), ctx(c))
        assert out.status == "succeeded" and out.output == "already gone", (fn.__name__, out)
    out = cancel(decision("999999", "cancel"), ctx(c))
    assert out.status == "succeeded" and out.details["already_gone"]


def test_dry_run_runs_nothing(clean, store) -> None:
    c = clean
    jid = c.submit("sleep 300", "--job-name=watched")
    c.wait_state(jid, "RUNNING", 30)
    for action in ("demote", "terminate", "kill", "cancel", "hold", "requeue"):
        res = execute([decision(jid, action, mode="dry-run")], ctx(c, dry_run=True), store)
        assert res[0]["status"] == "skipped" and res[0]["command"], res
    assert c.job_state(jid) == "RUNNING" and squeue(c, jid, "%y") == "0"  # not demoted, not signalled
    assert squeue(c, jid, "%r") in ("None", "")


class AsUser:
    """Run Slurm commands as another (unprivileged) user: a real permission boundary, not a fake."""

    def __init__(self, inner: LocalRunner, user: str) -> None:
        self.inner, self.user = inner, user

    def run(self, argv, *, timeout: float = 30.0, stdin=None) -> Completed:
        res = self.inner.run(["runuser", "-u", self.user, "--", *argv], timeout=timeout, stdin=stdin)
        return dataclasses.replace(res, argv=tuple(argv))


def test_permission_denied_is_a_clear_failure(clean) -> None:
    c = clean
    jid = c.submit("sleep 300", "--job-name=not-yours")
    c.wait_state(jid, "RUNNING", 30)
    nobody = AsUser(c.runner, "nobody")
    out = demote(decision(jid, "demote"), ctx(c, runner=nobody))
    assert out.status == "failed" and out.error.startswith("permission denied"), out
    out = terminate(decision(jid, "terminate"), ctx(c, runner=nobody))
    assert out.status == "failed" and "permission denied" in out.error and "Access/permission denied" in out.error
    assert c.job_state(jid) == "RUNNING"


def test_unreachable_controller_is_a_clear_failure(slurm_cluster, tmp_path) -> None:
    c = slurm_cluster
    conf = tmp_path / "slurm.conf"
    text = c.conf.read_text().replace(f"SlurmctldPort={c.ctld_port}", "SlurmctldPort=1")
    conf.write_text(text)
    env = dict(c.env, SLURM_CONF=str(conf))
    out = terminate(decision("1", "terminate"), ctx(c, runner=LocalRunner(env=env)))
    assert out.status == "failed" and "controller unreachable" in out.error, out
