"""SlurmSource against the real Slurm 22.05 test cluster: jobs with GPU indices, nodes, accounting."""

from __future__ import annotations

import time

import pytest

from gpu_cost.perceive.slurm import SlurmSource

pytestmark = pytest.mark.integration

NAME = "train; rm -rf / `x` $(y) 'q' \"dq\" ü 日本\nsecond line"


def test_running_and_pending_jobs_with_gpu_indices(slurm_cluster, tmp_path) -> None:
    c = slurm_cluster
    out = c.root / "jobs" / "gpus.txt"
    jid = c.submit(f'echo "$SLURM_JOB_GPUS" > {out}\nsleep 300', f"--job-name={NAME}", "--gres=gpu:a100:3",
                   "--comment=gpu-cost:no-interrupt", "--time=45", "--account=research")
    big = c.submit("sleep 300", "-N", "2", "--gres=gpu:4", "--job-name=waits")
    try:
        c.wait_state(jid, "RUNNING", 30)
        deadline = time.monotonic() + 15
        while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        seen_by_job = tuple(int(x) for x in out.read_text().strip().split(","))
        jobs = {j.job_id: j for j in SlurmSource(c.runner).jobs()}
        job = jobs[jid]
        assert job.name == NAME  # shell metacharacters, quotes, unicode and a newline, intact
        assert job.user == "root" and job.account == "research" and job.partition == "batch" and job.qos == "normal"
        assert job.labels == ("no-interrupt",) and job.time_limit_s == 45 * 60
        assert job.running and job.start_ts and job.submit_ts and len(job.nodes) == 1
        host, idx = job.gpu_alloc[0]
        assert host == job.nodes[0] and len(idx) == 3
        assert idx == seen_by_job  # what Slurm gave the job is what the source reports
        assert jobs[big].pending and jobs[big].gpus_requested == 8 and jobs[big].gpu_alloc == ()
        nodes = {n.name: n for n in SlurmSource(c.runner).nodes()}
        assert set(nodes) == set(c.nodes)
        assert nodes[host].gpus_alloc == 3 and nodes[host].gpus_total == 4 and nodes[host].state == "mixed"
        assert nodes[host].gpu_model == "a100"
    finally:
        c.cancel_all()


def test_finished_jobs_from_accounting(slurm_cluster) -> None:
    c = slurm_cluster
    t0 = time.time() - 5
    jid = c.submit("exit 0", "--job-name=short one", "--gres=gpu:2", "--comment=gpu-cost:inference")
    c.wait_state(jid, ("COMPLETED", "GONE"), 30)
    src = SlurmSource(c.runner)
    deadline = time.monotonic() + 20
    found = {}
    while time.monotonic() < deadline:
        found = {j.job_id: j for j in src.finished_jobs(t0, time.time() + 60)}
        if jid in found:
            break
        time.sleep(0.5)
    job = found[jid]
    # name, partition and limit are not asserted: slurmdbd sometimes records a quick job from its end
    # message alone (name "allocation", no limit); squeue's view of names is tested above
    assert job.state == "COMPLETED" and job.gpus_requested == 2
    assert job.end_ts >= job.start_ts >= t0 and job.nodes
    assert src.job(jid) is None or src.job(jid).state == "COMPLETED"
