"""Re-capture the 22.05 fixtures of this folder from a real test cluster (run as root).

    .venv/bin/python -m tests.data.slurm.capture

Starts the test cluster of ``tests/fixtures/slurm.py`` in a temp dir, submits a few jobs, saves
what ``squeue --json``, ``sinfo --json`` and ``sacct --json`` print, and stops the cluster.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tests.fixtures.slurm import SlurmCluster

HERE = Path(__file__).resolve().parent
NAME = "train; rm -rf / `x` $(y) 'q' \"dq\" ü 日本"


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="slurm-capture-"))
    root.chmod(0o755)
    c = SlurmCluster(root / "slurm")
    try:
        c.start()
        done = c.submit("exit 0", "--job-name=finished-quick", "--gres=gpu:1", "--comment=gpu-cost:inference")
        c.wait_state(done, "COMPLETED", 30)
        c.submit("sleep 600", f"--job-name={NAME}", "--gres=gpu:a100:2", "--comment=gpu-cost:no-interrupt owner=x",
                 "--time=01:00:00", "--account=research")
        c.submit("sleep 600", "--job-name=split", "-N", "2", "--gres=gpu:1", "--time=30")
        c.submit("sleep 600", "--job-name=waiting-big", "-N", "2", "--gres=gpu:4", "--qos=normal")
        time.sleep(3)
        c.run("scontrol", "update", "jobid=2", "nice=500")
        (HERE / "squeue-22.05.json").write_text(c.run("squeue", "--json").stdout)
        (HERE / "sinfo-22.05.json").write_text(c.run("sinfo", "--json").stdout)
        c.cancel_all()
        c.run("scontrol", "update", "nodename=gpu02", "state=POWER_DOWN", "reason=gpu-cost: off-hours")
        c.wait_node("gpu02", lambda s: "POWERED_DOWN" in s, 40)
        (HERE / "sinfo-22.05-powered-down.json").write_text(c.run("sinfo", "--json").stdout)
        time.sleep(2)
        (HERE / "sacct-22.05.json").write_text(
            c.run("sacct", "--json", "-X", "-a", "-S", "now-1hour", "-E", "now").stdout)
    finally:
        c.stop()


if __name__ == "__main__":
    main()
