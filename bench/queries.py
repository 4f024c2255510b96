"""Benchmark: PromQL queries, Slurm commands and node inspections per sweep, at growing cluster sizes.

The load the agent puts on Prometheus and the scheduler must not grow with the cluster. For each
size this starts a real Prometheus (``prometheus``) scraping the simulator's dcgm-format exporter
(``gpu-cost sim serve``) for a generated cluster of that many GPUs (8 per node), with the
``--history`` before the start written as TSDB blocks (``gpu-cost sim backfill`` + ``promtool``)
so the windows hold data, then runs ``--sweeps`` sweeps exactly as the sweep DAG does: the
freshness sensor (``live.check_fresh``) and the live snapshot (``live.snapshot``).

What is counted, per sweep:

- ``promql``: instant queries Prometheus itself served (its own counter
  ``prometheus_http_requests_total{handler="/api/v1/query"}``, read before and after), and the
  source's count (``PrometheusSource.queries_made``) beside it;
- ``slurm_cmds``: commands the Slurm source ran, through a counting runner. With ``--slurm real``
  (default when Slurm is installed and we are root) they run against a real two-node Slurm 22.05
  cluster started for the bench, with a few jobs queued; with ``--slurm argv`` the argument
  lists are recorded and answered with a failure (the count is what the code path issues);
- ``node_cmds``: node inspections (``gpu-cost-node-action inspect`` over SSH) the process reader
  would issue, recorded and not run (no GPU nodes here): one per node that can hold a zombie (a fresh
  GPU holding memory at ~0 % outside any job), run in parallel — at most one per node.

    python -m bench.queries [--sizes 64,1024] [--sweeps 2] [--history 1h] [--slurm auto|real|argv]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench._common import report

ROOT = Path(__file__).resolve().parents[1]
SCRAPE_S = 5
SLURM_BINARIES = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "squeue", "scontrol", "sbatch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpu_cost() -> str:
    exe = Path(sys.executable).with_name("gpu-cost")
    return str(exe) if exe.exists() else "gpu-cost"


def _check(argv: Sequence[str]) -> None:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr[-2000:]}")


class CountingRunner:
    """Wrap a runner (or none: record only) and keep every argument list it is given."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, stdin: str | None = None) -> Any:
        from gpu_cost.perceive.runner import Completed

        self.calls.append(tuple(str(a) for a in argv))
        if self.inner is None:
            return Completed(tuple(str(a) for a in argv), 1, "", "recorded by the bench, not run")
        return self.inner.run(argv, timeout=timeout, stdin=stdin)


class PromServer:
    """A real Prometheus scraping one simulated exporter of ``gpus`` GPUs, under ``root``."""

    def __init__(self, root: Path, gpus: int, history: float) -> None:
        self.root, self.gpus, self.history = root, gpus, history
        self.port, self.exporter_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.anchor = float(math.floor(time.time() / 60) * 60)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> PromServer:
        import yaml

        self.root.mkdir(parents=True, exist_ok=True)
        scenario = self.root / "scenario.yaml"
        nodes = max(1, math.ceil(self.gpus / 8))
        scenario.write_text(yaml.safe_dump({"seed": 5, "anchor": int(self.anchor),
                                            "generate": {"nodes": nodes, "gpus_per_node": 8, "pending": 0}}))
        data = self.root / "data"
        if self.history > 0:
            om = self.root / "history.om"
            _check([_gpu_cost(), "sim", "backfill", "--scenario", str(scenario), "--start", f"{int(self.history)}s",
                    "--end", str(int(self.anchor)), "--label", "job=gpu", "--label",
                    f"instance=127.0.0.1:{self.exporter_port}", "--out", str(om), "--json"])
            _check(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)])
            om.unlink()
        cfg = {"global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s",
                          "scrape_timeout": "4s"},
               "scrape_configs": [{"job_name": "gpu",
                                   "static_configs": [{"targets": [f"127.0.0.1:{self.exporter_port}"]}]}]}
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self._spawn("exporter", [_gpu_cost(), "sim", "serve", "--port", str(self.exporter_port), "--scenario",
                                 str(scenario), "--json"])
        self._spawn("prometheus", ["prometheus", f"--config.file={self.root / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{self.port}"])
        self._wait_scraped(timeout=120)
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.log", "wb") as log:
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True))

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as r:
            return bytes(r.read())

    def _wait_scraped(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args!r} exited {p.returncode}: see {self.root}")
            with contextlib.suppress(OSError, ValueError, KeyError):
                q = json.loads(self._get("/api/v1/query?query=count(up%3D%3D1)"))["data"]["result"]
                n = json.loads(self._get("/api/v1/query?query=count(DCGM_FI_DEV_GPU_UTIL)"))["data"]["result"]
                if q and n and int(float(n[0]["value"][1])) >= self.gpus:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"Prometheus at {self.url} did not scrape {self.gpus} GPUs within {timeout:g}s")

    def served_queries(self) -> int:
        """Return how many instant queries this Prometheus has answered (its own counter)."""
        total = 0
        for line in self._get("/metrics").decode().splitlines():
            if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line:
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self.procs.clear()


@contextlib.contextmanager
def slurm_runner(mode: str, root: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(how, runner)`` for the Slurm source: a real test cluster's runner, or None (record only)."""
    real_ok = all(shutil.which(b) for b in SLURM_BINARIES) and os.geteuid() == 0
    if mode == "argv" or (mode == "auto" and not real_ok):
        yield "argv lists recorded (no Slurm run)", None
        return
    if not real_ok:
        raise RuntimeError("--slurm real needs the Slurm binaries and root")
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.slurm import SlurmCluster  # the tests' recipe: real daemons on loopback

    cluster = SlurmCluster(root / "slurm")
    try:
        cluster.start()
        for _ in range(2):
            cluster.submit("sleep 600", "--gres=gpu:4")  # every GPU of one node
        cluster.submit("sleep 600", "--gres=gpu:2")  # no GPU left: stays pending
        yield "real Slurm 22.05 (2 nodes, 3 jobs)", cluster.runner
    finally:
        with contextlib.suppress(Exception):
            cluster.cancel_all()
        cluster.stop()


def measure(prom: PromServer, slurm: Any, sweeps: int) -> dict[str, Any]:
    """Run ``sweeps`` sweeps (sensor + live snapshot) and count what each one asked for."""
    from gpu_cost.config.loader import load_policy
    from gpu_cost.perceive import live
    from gpu_cost.perceive.nodes import NodeAccess, NodeSource
    from gpu_cost.perceive.prometheus import PromConfig, PrometheusSource
    from gpu_cost.perceive.slurm import SlurmSource

    policy = load_policy()
    logging.getLogger("gpu_cost.perceive.nodes").setLevel(logging.ERROR)  # the recorded inspections "fail"
    per: list[dict[str, Any]] = []
    for _ in range(sweeps):
        now = time.time() - SCRAPE_S
        source = PrometheusSource(PromConfig(url=prom.url, selector='job="gpu"', timeout=60))
        timings: dict[str, float] = {}
        real_query = source.query

        def timed(promql: str, at: float, what: str, keyed: bool = False, _q: Any = real_query,
                  _t: dict[str, float] = timings) -> Any:
            q0 = time.perf_counter()
            try:
                return _q(promql, at, what, keyed)
            finally:
                _t[what] = _t.get(what, 0.0) + time.perf_counter() - q0

        source.query = timed  # type: ignore[method-assign]
        slurm_counter = CountingRunner(slurm)
        node_counter = CountingRunner(None)
        nodes = NodeSource(NodeAccess(command=("gpu-cost-node-action",)), runner_for=lambda _h, c=node_counter: c)
        before = prom.served_queries()
        t0 = time.perf_counter()
        fresh, why = live.check_fresh(policy, now, prometheus=source)
        snap = live.snapshot(policy, now, prometheus=source, slurm=SlurmSource(runner=slurm_counter),
                             node_source=nodes, processes=True)
        dt = time.perf_counter() - t0
        per.append({"promql_server": prom.served_queries() - before, "promql_client": source.queries_made,
                    "slurm_cmds": len(slurm_counter.calls), "node_cmds": len(node_counter.calls), "seconds": dt,
                    "gpus_seen": len(snap.gpus), "stale": int(snap.gpus["stale"].sum()) if len(snap.gpus) else 0,
                    "fresh": fresh, "slurm_argv": sorted({" ".join(c) for c in slurm_counter.calls}),
                    "why": why, "query_s": {k: round(v, 3) for k, v in timings.items()}, "problems": [p for p in snap.problems if not p.startswith("node processes")]})
    first = per[0]
    fastest = min(per, key=lambda p: float(p["seconds"]))
    return {
        "promql_per_sweep": first["promql_server"], "promql_client": first["promql_client"],
        "slurm_cmds_per_sweep": first["slurm_cmds"], "node_cmds_per_sweep": first["node_cmds"],
        "constant_over_sweeps": all(p["promql_server"] == first["promql_server"] and p["slurm_cmds"] ==
                                    first["slurm_cmds"] for p in per),
        "sweep_s": fastest["seconds"], "promql_s": sum(fastest["query_s"].values()), "query_s": fastest["query_s"],
        "gpus_seen": first["gpus_seen"], "stale_gpus": first["stale"],
        "fresh": first["fresh"], "slurm_argv": " | ".join(first["slurm_argv"]),
        "problems": "; ".join(first["problems"])[:200] or "-",
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64,1024", help="cluster sizes in GPUs (8 per node)")
    ap.add_argument("--sweeps", type=int, default=2, help="sweeps per size (the count must not change)")
    ap.add_argument("--history", type=float, default=3600.0, help="seconds of backfilled history (0: none)")
    ap.add_argument("--slurm", choices=["auto", "real", "argv"], default="auto")
    args = ap.parse_args(argv)
    missing = [b for b in ("prometheus", "promtool") if not shutil.which(b)]
    if missing:
        raise SystemExit(f"bench.queries needs {', '.join(missing)} (scripts/install-system-deps.sh installs them)")
    tmp = Path(tempfile.mkdtemp(prefix="gpu-cost-bench-queries-"))
    tmp.chmod(0o755)  # the Slurm test cluster runs munged and MariaDB as their own users under it
    rows = []
    try:
        with slurm_runner(args.slurm, tmp) as (how, runner):
            for size in (int(s) for s in args.sizes.split(",")):
                prom = PromServer(tmp / f"prom-{size}", size, args.history)
                try:
                    t0 = time.perf_counter()
                    prom.start()
                    setup = time.perf_counter() - t0
                    row = {"gpus": size, "nodes": max(1, math.ceil(size / 8)), **measure(prom, runner, args.sweeps),
                           "setup_s": setup, "slurm": how}
                finally:
                    prom.stop()
                rows.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in rows:
        r["same_as_smallest"] = (r["promql_per_sweep"] == rows[0]["promql_per_sweep"]
                                 and r["slurm_cmds_per_sweep"] == rows[0]["slurm_cmds_per_sweep"])
    report("queries", rows, ["gpus", "nodes", "promql_per_sweep", "promql_client", "slurm_cmds_per_sweep",
                             "node_cmds_per_sweep", "constant_over_sweeps", "same_as_smallest", "sweep_s", "promql_s",
                             "gpus_seen", "stale_gpus", "fresh", "slurm"])


if __name__ == "__main__":
    main(sys.argv[1:])
