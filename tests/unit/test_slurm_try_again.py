"""Slurm's own "try again" answers are asked again a few times; any other failure stands at once."""

from __future__ import annotations

from collections.abc import Sequence

from gpu_cost.act import slurm as slurm_actions
from gpu_cost.act.base import ActionContext
from gpu_cost.config.loader import load_policy
from gpu_cost.perceive.runner import Completed

# what slurmctld 22.05 answered in a CI run, a few seconds after a controller restart
NOT_NOW = "Job update not available right now, the DB index is being set, try again in a bit for job 12\n"


class Scripted:
    """Answers each command with the next of ``answers`` (rc, stderr); records what it was asked."""

    def __init__(self, answers: Sequence[tuple[int, str]]) -> None:
        self.answers = list(answers)
        self.asked: list[list[str]] = []

    def run(self, argv: Sequence[str], timeout: float | None = None) -> Completed:
        self.asked.append(list(argv))
        rc, err = self.answers.pop(0)
        return Completed(tuple(argv), rc, "", err)


def _ctx(runner: Scripted, slept: list[float]) -> ActionContext:
    return ActionContext(policy=load_policy(), dry_run=False, now=0.0, run_id="t", slurm=runner, sleep=slept.append)


ARGV = ["scontrol", "update", "jobid=12", "nice=10000"]


def test_asked_again_until_slurm_takes_it() -> None:
    runner, slept = Scripted([(1, NOT_NOW), (1, NOT_NOW), (0, "")]), []
    res = slurm_actions._run(_ctx(runner, slept), ARGV)
    assert res.ok and runner.asked == [ARGV] * 3 and slept == [1.0, 2.0]


def test_gives_up_after_the_pauses_with_slurms_answer() -> None:
    runner, slept = Scripted([(1, NOT_NOW)] * 6), []
    res = slurm_actions._run(_ctx(runner, slept), ARGV)
    assert not res.ok and "try again" in res.stderr
    assert len(runner.asked) == 5 and slept == [1.0, 2.0, 4.0, 8.0] and len(runner.answers) == 1


def test_other_failures_are_not_asked_again() -> None:
    runner, slept = Scripted([(1, "scontrol: error: Invalid job id specified\n"), (0, "")]), []
    res = slurm_actions._run(_ctx(runner, slept), ARGV)
    assert not res.ok and len(runner.asked) == 1 and slept == []
