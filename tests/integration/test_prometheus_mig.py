"""MIG slices through a real Prometheus: the simulated dcgm-exporter labels slices as dcgm-exporter
does (``GPU_I_ID``, ``GPU_I_PROFILE``, no device utilisation), and the Prometheus source reads each
slice as a device of its own, the same as the simulator's aggregation; a sweep on that data finds
what the simulator finds (the zombie on one slice only, the shared GPU advised, the partly idle
multi-node job advised)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_cost.perceive.prometheus import PrometheusSource
from tests.fixtures.prometheus import PromLab
from tests.integration.test_prometheus import SimScheduler

pytestmark = pytest.mark.integration

JOB = "gpu-modern"


class SimSide(SimScheduler):
    """The simulated cluster's scheduler and nodes (jobs, and nvidia-smi's processes over SSH)."""

    def __init__(self, path, now: float) -> None:  # type: ignore[no-untyped-def]
        super().__init__(path, now)
        self.asked: list[str] = []

    def processes(self, hosts):  # type: ignore[no-untyped-def]
        self.asked = list(hosts)
        # what nvidia-smi shows: the slice's MIG UUID and (-L) its profile, not its GPU instance id
        procs = [p for p in self.cluster.processes_at(self.now) if p.host in hosts]
        return [p.__class__(**{**p.to_dict(), "mig": ""}) for p in procs], []

    def job_logs(self, jobs, max_bytes):  # type: ignore[no-untyped-def]
        return {}


def test_the_source_reads_mig_slices_as_devices(prom_lab: PromLab, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.sim.cluster import load_scenario
    from gpu_cost.sim.cluster import snapshot as sim_snapshot

    at = prom_lab.anchor
    raw = prom_lab.query(f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{job="{JOB}",GPU_I_ID!=""}}', at)
    assert len(raw) == 6 and {s["metric"]["GPU_I_PROFILE"] for s in raw} == {"3g.40gb", "2g.20gb", "1g.10gb", "4g.40gb"}
    assert not prom_lab.query(f'DCGM_FI_DEV_GPU_UTIL{{job="{JOB}",GPU_I_ID!=""}}', at)

    frame, _ = PrometheusSource(prom_lab.config(f'job="{JOB}"')).gpu_frame(policy, at)
    sim = sim_snapshot(policy, at, load_scenario(prom_lab.scenarios[JOB])).gpus
    p = frame.set_index(["host", "gpu", "mig"]).sort_index()
    s = sim.set_index(["host", "gpu", "mig"]).sort_index()
    assert list(p.index) == list(s.index) and len(p) == 28
    assert (p["mig_profile"] == s["mig_profile"]).all() and (p["uuid"] == s["uuid"]).all()
    np.testing.assert_allclose(p["share"].to_numpy(float), s["share"].to_numpy(float), atol=1e-9)
    for col in ("util_mean", "util_max", "util_max_lb", "busy_share_lb"):
        np.testing.assert_allclose(p[col].to_numpy(float), s[col].to_numpy(float), atol=0.01, err_msg=col)
    for col in ("mem_min_mib", "mem_max_mib", "mem_total_mib"):
        np.testing.assert_allclose(p[col].to_numpy(float), s[col].to_numpy(float), atol=1.0, err_msg=col)
    assert (p["n_samples"].to_numpy() == s["n_samples"].to_numpy()).all() and not p["stale"].any()
    sl = p.loc[("gpu01", 0)]
    assert sl.loc["1", "util_max"] > 50 and sl.loc["3", "util_max"] < 1 and sl.loc["3", "mem_min_mib"] > 1024
    assert p.loc[("gpu01", 0, "3"), "mem_total_mib"] == 10240 and np.isnan(p.loc[("gpu01", 0, "3"), "power_w"])


def test_a_sweep_on_prometheus_finds_what_the_simulator_finds(prom_lab: PromLab, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.perceive import live
    from gpu_cost.sim.cluster import load_scenario
    from gpu_cost.sim.cluster import snapshot as sim_snapshot

    at = prom_lab.anchor
    side = SimSide(prom_lab.scenarios[JOB], at)
    snap = live.snapshot(policy, at, prometheus=PrometheusSource(prom_lab.config(f'job="{JOB}"')), slurm=side,
                         node_source=side, processes=True)
    assert not snap.problems, snap.problems
    assert "gpu01" in side.asked, "an idle slice holding memory makes its node worth an inspection"
    got = {(f.rule, f.target, f.action, f.gpu_ids) for f in run_rules(snap, policy)}
    want = {(f.rule, f.target, f.action, f.gpu_ids)
            for f in run_rules(sim_snapshot(policy, at, load_scenario(prom_lab.scenarios[JOB])), policy)}
    assert got == want
    zombies = [g for g in got if g[0] == "zombie"]
    assert len(zombies) == 1 and zombies[0][3] == ("gpu01:0/mig3",) and zombies[0][2] == "kill_process"
    assert ("partly_idle", "job:2005", "advise") in {g[:3] for g in got}
    assert {g[:3] for g in got if g[1] in ("job:2006", "job:2007")} == {
        ("idle_allocation", "job:2006", "advise"), ("idle_allocation", "job:2007", "advise")}
    # the zombie's slice was joined to nvidia-smi's MIG UUID by its profile (unique on that GPU)
    row = snap.gpus.set_index(["host", "gpu", "mig"]).loc[("gpu01", 0, "3")]
    assert str(row["mig_uuid"]).startswith("MIG-") and row["attribution"] == "none"
