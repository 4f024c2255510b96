"""The join of GPUs, jobs and processes: one job's GPU is its own; every disagreement of the sources is said.

The sweep takes a fast path for the common GPU (one job holds it, no other job's process on it); these
cases pin what each kind of GPU gets, so that path and the full test agree.
"""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_cost.core.model import GpuProcess, Job
from gpu_cost.perceive.correlate import attribute


def frame(labels: list[str]) -> pd.DataFrame:
    """Four GPUs on node g1 (uuids GPU-0..3), with the exporter's job label of each."""
    return pd.DataFrame({"host": ["g1"] * 4, "gpu": [0, 1, 2, 3], "uuid": [f"GPU-{i}" for i in range(4)],
                         "label_job_id": labels})


def job(job_id: str, gpus: tuple[int, ...], **kw: object) -> Job:
    return Job(job_id=job_id, user="ann", gpu_alloc=(("g1", gpus),), nodes=("g1",), **kw)  # type: ignore[arg-type]


def proc(pid: int, gpu: int, job_id: str | None) -> GpuProcess:
    return GpuProcess(host="g1", pid=pid, gpu_uuid=f"GPU-{gpu}", gpu=gpu, used_mib=1000.0, start_ts=1.0, job_id=job_id)


@pytest.mark.parametrize(("labels", "procs", "want", "said"), [
    # Slurm alone; its job's own processes and label agreeing
    (["", "", "", ""], [proc(1, 0, "7"), proc(2, 1, "7")], ["7", "7", None, None], []),
    (["7", "7", "", ""], [], ["7", "7", None, None], []),
    # the label names another running job: a conflict, whichever way the GPU looked
    (["8", "", "", ""], [], [None, "7", None, None], ["sources name different jobs: slurm=7 label=8"]),
    # a process of another running job on the GPU: a conflict
    (["", "", "", ""], [proc(3, 1, "8")], ["7", None, None, None], ["sources name different jobs: slurm=7"]),
    # an orphan (its job ended) on the job's GPU: the job keeps it, the orphan is said
    (["", "", "", ""], [proc(4, 0, "5")], ["7", "7", None, None],
     ["process 4 of ended job 5 holds 1000 MiB on a GPU Slurm allocates to running job 7"]),
    # nobody's GPU that a running job's label or process claims: a conflict; else none
    (["", "", "8", ""], [], ["7", "7", None, None], ["label names running job 8 but Slurm allocates the GPU to none"]),
    (["", "", "", ""], [proc(5, 3, "8")], ["7", "7", None, None], ["processes of running job(s) 8 on a GPU"]),
], ids=["slurm-and-own-processes", "label-agrees", "label-names-another", "process-of-another", "orphan",
        "label-on-free-gpu", "process-on-free-gpu"])
def test_each_gpu_gets_the_job_its_sources_agree_on(labels: list[str], procs: list[GpuProcess],
                                                    want: list[str | None], said: list[str]) -> None:
    jobs = [job("7", (0, 1)), job("8", (), state="RUNNING"), job("5", (2,), state="COMPLETED")]
    out, problems = attribute(frame(labels), jobs, procs)
    assert out["job_id"].tolist() == want
    how = out["attribution"].tolist()
    assert all((h == "slurm") == (w is not None) for h, w in zip(how, want, strict=True))
    assert len(problems) == len(said)
    for p, text in zip(problems, said, strict=True):
        assert text in p.what


def test_a_gpu_two_jobs_hold_or_one_shared_job_holds_is_shared() -> None:
    jobs = [job("7", (0,)), job("8", (0,)), job("9", (1,), gpu_shared=True)]
    out, problems = attribute(frame(["", "", "", ""]), jobs, [])
    assert out["job_id"].tolist() == [None, None, None, None]
    assert out["attribution"].tolist() == ["shared", "shared", "none", "none"]
    assert out["sharers"].tolist() == ["7,8", "9", "", ""] and problems == []
