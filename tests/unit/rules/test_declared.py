"""What a policy declares a job (an inference service, an interactive session) is read the same way however it is
asked: one matcher per policy, and one reading of the sweep's sessions that both idle rules share.

The definition below is the plain reading of the policy: the partition, then each name glob in the order the
policy lists them (case-insensitive), then each label. Random jobs and random pattern sets, glob metacharacters and
mixed case included, must get the same answer from :func:`declared`.
"""

from __future__ import annotations

import fnmatch
import random
from collections.abc import Iterable

import pytest

from gpu_cost.analyse.rules.common import declared, sessions
from gpu_cost.config.schema import InteractiveConfig, Policy
from gpu_cost.core.model import Job
from tests.unit.rules.test_idle_evidence import H, idle_for, job, rules_of, snap

WORDS = ["serve", "Serve", "vllm", "jupyter", "notebook", "bash", "sh", "train", "llm", "tgi", "x", "[a]", "a?b", "*",
         "infer-ence", "triton.1", "sys/dashboard/app", ""]
GLOBS = ["*serve*", "*SERVE*", "jupyter*", "*notebook*", "bash", "sh", "sys/dashboard/*", "*vllm*", "[a]*", "a?b",
         "*[!x]", "train-?", "*.1", "tgi", "[", "*"]


def by_definition(job: Job, partitions: Iterable[str], name_patterns: Iterable[str],
                  labels: Iterable[str]) -> str | None:
    """The policy read job by job, glob by glob: what :func:`declared` must answer."""
    if job.partition and job.partition in tuple(partitions):
        return f"partition {job.partition}"
    if job.name:
        for pat in name_patterns:
            if fnmatch.fnmatchcase(job.name.lower(), pat.lower()):
                return f"name matches {pat}"
    for label in labels:
        if label in job.labels:
            return f"label {label}"
    return None


def random_job(rng: random.Random) -> Job:
    name = "-".join(rng.choice(WORDS) for _ in range(rng.randint(0, 3)))
    if rng.random() < 0.3:
        name = name.upper()
    return Job(job_id=str(rng.randint(1, 10**6)), user="u", partition=rng.choice(["", "batch", "serve", "interactive"]),
               name=name or rng.choice(["", None]),  # type: ignore[arg-type]
               labels=tuple(rng.sample(["inference", "interactive", "prod", "web"], rng.randint(0, 2))))


@pytest.mark.parametrize("seed", range(8))
def test_declared_reads_the_policy_as_its_definition_does(seed: int) -> None:
    rng = random.Random(seed)
    answers = set()
    for _ in range(40):
        partitions = tuple(rng.sample(["batch", "serve", "interactive", "gpu"], rng.randint(0, 2)))
        globs = tuple(rng.sample(GLOBS, rng.randint(0, 5)))
        labels = tuple(rng.sample(["inference", "interactive", "web"], rng.randint(0, 2)))
        for _ in range(60):
            j = random_job(rng)
            want = by_definition(j, partitions, globs, labels)
            # lists as well as tuples: a policy's sections hold tuples, a caller may hand lists
            assert declared(j, partitions, globs, labels) == want, (j, partitions, globs, labels)
            assert declared(j, list(partitions), list(globs), list(labels)) == want
            answers.add((want or "none").split(" ")[0])
    assert answers == {"partition", "name", "label", "none"}  # the draws reach every answer


def test_the_first_glob_the_policy_lists_is_the_one_named() -> None:
    j = Job(job_id="1", user="u", name="Jupyter-Notebook-3")
    assert declared(j, (), ("*notebook*", "jupyter*"), ()) == "name matches *notebook*"
    assert declared(j, (), ("jupyter*", "*notebook*"), ()) == "name matches jupyter*"


def test_each_policy_gets_its_own_sessions_on_one_snapshot() -> None:
    """Both idle rules read the sweep's sessions once; another policy on the same snapshot reads its own."""
    s = snap(util=idle_for(3 * H), jobs=(job(name="lab-7", batch=True),))
    plain = Policy()
    lab = Policy(interactive=InteractiveConfig(name_patterns=("lab-*",)))
    assert sessions(s, plain.interactive) == [None]
    assert sessions(s, lab.interactive) == ["name matches lab-*"]
    assert rules_of(s, plain) == {"idle_allocation"}
    assert rules_of(s, lab) == {"idle_interactive"}
    assert rules_of(s, plain) == {"idle_allocation"}  # and back: nothing kept of the other policy's reading
