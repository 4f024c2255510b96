"""Simulated GPUs for real servers: dcgm-exporter's exposition format, history, nvidia-smi state.

``gpu-cost sim serve`` exposes the GPUs of a simulator scenario exactly as NVIDIA's dcgm-exporter
prints them (metric names, HELP/TYPE, labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION`` and, with the HPC job mapping, ``hpc_job``),
so a real Prometheus scrapes them. Two drivers:

- a scenario alone (:class:`ScenarioFeed`): the anchor is fixed when the exporter starts, so the
  cluster evolves in real time;
- the jobs that really run on a Slurm cluster (:class:`SlurmFeed`): each running job's GPU indices
  come from Slurm, its behaviour from its comment (``gpu-cost-sim:zombie``, with optional
  parameters ``gpu-cost-sim:inference:burst_every=40s:burst_length=10s``) or a behaviour word in
  its name; a zombie job's memory stays held after Slurm forgets it.

A scrape at time ``t`` shows the simulator's sample for the interval in progress
(``ceil(t / interval) * interval``): a sample describes the interval that ends at its timestamp.
:func:`openmetrics_history` writes the same series for a past range (for
``promtool tsdb create-blocks-from openmetrics``), so a fresh Prometheus can hold hours of history.
:func:`nvidia_smi_state` writes the JSON state the fake ``nvidia-smi`` (``include/sim/nvidia-smi``)
prints in nvidia-smi's real CSV formats.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gpu_cost.core.model import Job
from gpu_cost.core.timeutil import parse_duration
from gpu_cost.sim.cluster import BEHAVIOURS, Scenario, SimCluster, SimJob, SimNode, resolve_anchor

logger = logging.getLogger(__name__)

DRIVER_VERSION = "535.129.03"
#: dcgm-exporter's metrics this exporter serves: (name, HELP text as dcgm-exporter prints it)
METRICS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active."),
)
#: fields DCGM has no value for on a MIG slice (device-level utilisation is not valid there: a
#: slice's utilisation is DCGM_FI_PROF_GR_ENGINE_ACTIVE of its GPU instance)
DEVICE_ONLY = frozenset({"DCGM_FI_DEV_GPU_UTIL"})
MODEL_NAMES = {
    "a100": "NVIDIA A100-SXM4-80GB", "h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200",
    "a10g": "NVIDIA A10G", "l40s": "NVIDIA L40S", "v100": "Tesla V100-SXM2-32GB", "t4": "Tesla T4",
}
COMMENT_PREFIX = "gpu-cost-sim:"


def model_name(model: str) -> str:
    """Return the marketing name nvidia-smi and DCGM print for a short model key."""
    return MODEL_NAMES.get(model.lower(), f"NVIDIA {model.upper()}")


@dataclasses.dataclass
class GpuState:
    """Every GPU at one instant (arrays aligned by row)."""

    ts: float
    hosts: np.ndarray
    gpus: np.ndarray
    uuids: np.ndarray
    models: np.ndarray
    total: np.ndarray
    util: np.ndarray
    mem: np.ndarray
    power: np.ndarray
    job: np.ndarray
    #: per row, the MIG columns (``mig``, ``mig_profile``, ``mig_uuid``, ``share``); None without slices
    mig: Mapping[str, np.ndarray] | None = None


def state_of(cluster: SimCluster, t: float) -> GpuState:
    """Return the GPUs as a scrape at ``t`` sees them (the sample of the interval in progress)."""
    step = cluster.scenario.sample_interval
    grid = math.ceil(t / step) * step
    m = cluster.matrix(grid - step, grid)
    col = m.util.shape[1] - 1
    if col < 0:  # cannot happen on the grid, but never expose garbage
        raise RuntimeError(f"no simulated sample at {grid}")
    return GpuState(grid, m.hosts, m.gpus, m.uuids, m.models, m.mem_total, m.util[:, col], m.mem[:, col],
                    m.power[:, col], m.job[:, col], m.mig)


def _mig_of(state: GpuState, i: int) -> tuple[str, str]:
    """Return ``(GPU instance id, profile)`` of row ``i`` (empty strings for a whole GPU)."""
    if state.mig is None:
        return "", ""
    return str(state.mig["mig"][i] or ""), str(state.mig["mig_profile"][i] or "")


def _labels(state: GpuState, i: int, domain: str = "") -> dict[str, str]:
    g = int(state.gpus[i])
    labels = {
        "gpu": str(g),
        "UUID": str(state.uuids[i]),
        "pci_bus_id": f"00000000:{0x07 + 0x10 * g:02X}:00.0",
        "device": f"nvidia{g}",
        "modelName": model_name(str(state.models[i])),
        "Hostname": f"{state.hosts[i]}.{domain}" if domain else str(state.hosts[i]),
        "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
    }
    gi, profile = _mig_of(state, i)
    if gi:
        # dcgm-exporter's labels on a MIG slice: UUID and gpu stay the parent's
        labels["GPU_I_PROFILE"] = profile
        labels["GPU_I_ID"] = gi
    if state.job[i]:
        labels["hpc_job"] = str(state.job[i])
    return labels


def _values(state: GpuState) -> dict[str, np.ndarray]:
    util = np.clip(state.util, 0, 100)
    mem = np.round(state.mem)
    return {
        "DCGM_FI_DEV_GPU_TEMP": np.round(30 + 0.45 * util),
        "DCGM_FI_DEV_POWER_USAGE": np.round(state.power, 3),
        "DCGM_FI_DEV_GPU_UTIL": np.round(util),
        "DCGM_FI_DEV_FB_FREE": np.round(state.total) - mem,
        "DCGM_FI_DEV_FB_USED": mem,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": np.round(util / 100.0, 6),
    }


# ---------------------------------------------------------------------------------------------
# feeds: what the exporter shows


class ScenarioFeed:
    """GPUs of a scenario whose anchor is fixed at ``started`` (the cluster lives in real time)."""

    def __init__(self, scenario: Scenario, started: float | None = None) -> None:
        start = time.time() if started is None else started
        anchor = resolve_anchor(scenario.anchor, start)
        self.cluster = SimCluster(dataclasses.replace(scenario, anchor=anchor), anchor=anchor)

    def state(self, t: float) -> GpuState:
        return state_of(self.cluster, t)


def behaviour_of(job: Job) -> tuple[str, dict[str, float]]:
    """Return the simulated behaviour of a real job and its parameters.

    ``--comment gpu-cost-sim:inference:burst_every=40s:burst_length=10s`` → ``("inference",
    {"burst_every": 40.0, "burst_length": 10.0})``; else a behaviour word in the job name; else training.
    """
    for token in job.comment.replace(",", " ").split():
        if token.startswith(COMMENT_PREFIX):
            parts = token[len(COMMENT_PREFIX):].split(":")
            if parts[0] in BEHAVIOURS:
                params: dict[str, float] = {}
                for p in parts[1:]:
                    key, _, value = p.partition("=")
                    if key in ("burst_every", "burst_length", "busy_first", "linger"):
                        params[key] = parse_duration(value)
                    elif key == "leak_mib_per_h":
                        params[key] = float(value)
                    elif key == "idle_gpus":
                        params[key] = int(value)
                return parts[0], params
    lowered = job.name.lower()
    for b in BEHAVIOURS:
        if b in lowered:
            return b, {}
    return "training", {}


class SlurmFeed:
    """GPUs driven by the jobs that really run on a Slurm cluster.

    :param nodes: the cluster's GPU nodes (names and GPU counts must match Slurm's).
    :param read_jobs: returns Slurm's jobs now (default: :class:`gpu_cost.perceive.slurm.SlurmSource`).
    :param refresh_s: read Slurm at most this often (scrapes in between reuse the last answer).
    """

    def __init__(self, nodes: Sequence[SimNode], read_jobs: Callable[[], Sequence[Job]], *, sample_interval: float = 5.0,
                 seed: int = 0, started: float | None = None, refresh_s: float = 2.0) -> None:
        self.nodes = tuple(nodes)
        self.read_jobs = read_jobs
        self.sample_interval = float(sample_interval)
        self.seed = seed
        self.anchor = math.floor((time.time() if started is None else started) / self.sample_interval) * self.sample_interval
        self.refresh_s = refresh_s
        self._jobs: dict[str, SimJob] = {}
        self._last_read = -math.inf
        self._cluster: SimCluster | None = None
        self._lock = threading.Lock()

    def _refresh(self, t: float) -> None:
        if t - self._last_read < self.refresh_s and self._cluster is not None:
            return
        self._last_read = t
        try:
            jobs = list(self.read_jobs())
        except Exception as exc:
            logger.warning("reading Slurm jobs failed, keeping the last picture: %s", exc)
            if self._cluster is None:
                self._rebuild()
            return
        names = {n.name for n in self.nodes}
        running = {}
        for j in jobs:
            if not j.running or j.start_ts is None:
                continue
            # every node of a multi-node job shows its GPUs: the first as the job's node, the rest as ``also``
            alloc = [(host, tuple(int(i) for i in idx)) for host, idx in j.gpu_alloc if host in names and idx]
            if alloc:
                running[j.job_id] = (j, alloc)
        changed = False
        for jid, (j, alloc) in running.items():
            if jid not in self._jobs:
                beh, params = behaviour_of(j)
                (host, idx), rest = alloc[0], tuple(alloc[1:])
                self._jobs[jid] = SimJob(job_id=jid, user=j.user, behaviour=beh, node=host, gpus=idx, also=rest,
                                         start=float(j.start_ts or 0.0) - self.anchor, name=j.name, comment=j.comment,
                                         account=j.account, partition=j.partition, **params)  # type: ignore[arg-type]
                changed = True
        for jid, sj in list(self._jobs.items()):
            if jid not in running and sj.end is None:
                # gone from Slurm: ended now (a zombie's process lingers; the others free their GPUs)
                self._jobs[jid] = dataclasses.replace(sj, end=max(sj.start or 0.0, t - self.anchor))
                changed = True
        if changed or self._cluster is None:
            self._rebuild()

    def _rebuild(self) -> None:
        sc = Scenario(self.nodes, tuple(self._jobs.values()), self.seed, self.sample_interval, self.anchor, "<slurm>",
                      {n.name: i for i, n in enumerate(self.nodes)})
        self._cluster = SimCluster(sc, anchor=self.anchor)

    def scenario(self) -> Scenario:
        """Return the scenario equivalent of what the feed has seen so far (for comparisons)."""
        with self._lock:
            self._refresh(time.time())
            assert self._cluster is not None
            return self._cluster.scenario

    def state(self, t: float) -> GpuState:
        with self._lock:
            self._refresh(t)
            assert self._cluster is not None
            return state_of(self._cluster, t)


# ---------------------------------------------------------------------------------------------
# the exporter


class DcgmCollector:
    """A prometheus_client collector printing a feed's GPUs as dcgm-exporter does."""

    def __init__(self, feed: Any, clock: Callable[[], float] = time.time, domain: str = "") -> None:
        self.feed = feed
        self.clock = clock
        #: a DNS domain the ``Hostname`` label carries after the node's name, as on nodes whose hostname is
        #: fully qualified ("": the node's name alone)
        self.domain = domain

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import Metric

        state = self.feed.state(self.clock())
        values = _values(state)
        labels = [_labels(state, i, self.domain) for i in range(len(state.hosts))]
        for name, doc in METRICS:
            metric = Metric(name, doc, "gauge")
            for i, lab in enumerate(labels):
                if name in DEVICE_ONLY and "GPU_I_ID" in lab:
                    continue
                metric.add_sample(name, lab, float(values[name][i]))
            yield metric

    def describe(self) -> list[Any]:
        return []  # collected on every scrape, never at registration


def exposition(feed: Any, t: float) -> str:
    """Return the text a scrape at ``t`` gets (Prometheus text format 0.0.4)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmCollector(feed, clock=lambda: t))
    return generate_latest(registry).decode()


def serve(feed: Any, host: str, port: int, domain: str = "") -> tuple[Any, Any]:
    """Start the HTTP exporter in a background thread; return ``(server, thread)`` (``domain``: see
    :class:`DcgmCollector`)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmCollector(feed, domain=domain))
    server, thread = start_http_server(port, addr=host, registry=registry)
    logger.info("dcgm-format exporter on http://%s:%d/metrics", host, port)
    return server, thread


# ---------------------------------------------------------------------------------------------
# history for promtool and state for the fake nvidia-smi


def _om_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def openmetrics_history(cluster: SimCluster, start: float, end: float, extra_labels: Mapping[str, str] | None = None) -> Iterator[str]:
    """Yield OpenMetrics lines (ending with ``# EOF``) holding the exporter's series in ``(start, end]``.

    Each sample carries the labels a scrape would have (plus ``extra_labels``, e.g. Prometheus's
    ``job`` and ``instance``), so backfilled history and live scrapes form the same series. Where
    a GPU's ``hpc_job`` label changes, the old series gets a NaN sample, as Prometheus would mark
    it stale, so it does not linger for the 5-minute lookback delta.
    """
    m = cluster.matrix(start, end)
    extra = dict(extra_labels or {})
    full = GpuState(end, m.hosts, m.gpus, m.uuids, m.models, m.mem_total[:, None], m.util, m.mem, m.power, m.job, m.mig)
    values = _values(full)
    base = []
    sliced = []
    for row in range(len(m.hosts)):
        mig = None if m.mig is None else {k: v[row:row + 1] for k, v in m.mig.items()}
        one = GpuState(end, m.hosts[row:row + 1], m.gpus[row:row + 1], m.uuids[row:row + 1], m.models[row:row + 1],
                       m.mem_total[row:row + 1], m.util[row:row + 1, 0], m.mem[row:row + 1, 0], m.power[row:row + 1, 0],
                       np.array([""], dtype=object), mig)
        labels = {**_labels(one, 0), **extra}
        sliced.append("GPU_I_ID" in labels)
        base.append(",".join(f'{k}="{_om_escape(v)}"' for k, v in labels.items()))
    stamps = [str(int(ts)) for ts in m.times]
    for name, doc in METRICS:
        yield f"# HELP {name} {doc}"
        yield f"# TYPE {name} gauge"
        vals = values[name]
        for row in range(len(m.hosts)):
            if name in DEVICE_ONLY and sliced[row]:
                continue
            prev = None
            for col, ts in enumerate(stamps):
                job = m.job[row, col]
                if prev is not None and job != prev:
                    # the series with the old job label ends here: a live scrape would leave a
                    # staleness marker; a NaN does the same for queries (aggregations skip it)
                    old = f'{base[row]},hpc_job="{_om_escape(str(prev))}"' if prev else base[row]
                    yield f"{name}{{{old}}} NaN {ts}"
                prev = job
                lab = f'{base[row]},hpc_job="{_om_escape(str(job))}"' if job else base[row]
                yield f"{name}{{{lab}}} {float(vals[row, col])!r} {ts}"
    yield "# EOF"


def nvidia_smi_state(cluster: SimCluster, host: str, t: float) -> dict[str, Any]:
    """Return the state file the fake ``nvidia-smi`` reads: the GPUs and processes of ``host`` at ``t``."""
    state = state_of(cluster, t)
    rows = [i for i in range(len(state.hosts)) if state.hosts[i] == host]
    if not rows:
        raise ValueError(f"host {host!r} is not a node of the scenario")
    gpus: list[dict[str, Any]] = []
    parents: dict[int, dict[str, Any]] = {}
    node = next(n for n in cluster.scenario.nodes if n.name == host)
    for i in rows:
        gi, profile = _mig_of(state, i)
        if not gi:
            gpus.append(
                {"index": int(state.gpus[i]), "uuid": str(state.uuids[i]), "name": model_name(str(state.models[i])),
                 "memory_total": round(float(state.total[i])), "memory_used": round(float(state.mem[i])),
                 "utilization": round(float(state.util[i])), "power_draw": round(float(state.power[i]), 2),
                 "temperature": round(30 + 0.45 * float(state.util[i]))})
            continue
        # a MIG GPU: nvidia-smi lists the parent (its utilisation is N/A in MIG mode) with its slices
        parent = parents.get(int(state.gpus[i]))
        if parent is None:
            parent = {"index": int(state.gpus[i]), "uuid": str(state.uuids[i]), "name": model_name(str(state.models[i])),
                      "memory_total": round(node.mem_total_mib), "memory_used": 0, "utilization": None,
                      "power_draw": 0.0, "temperature": 30, "mig": []}
            parents[int(state.gpus[i])] = parent
            gpus.append(parent)
        assert state.mig is not None
        parent["memory_used"] += round(float(state.mem[i]))
        parent["power_draw"] = round(parent["power_draw"] + float(state.power[i]), 2)
        parent["mig"].append({"gi": int(gi), "profile": profile, "uuid": str(state.mig["mig_uuid"][i]),
                              "memory_total": round(float(state.total[i])), "memory_used": round(float(state.mem[i]))})
    procs = [
        {"pid": p.pid, "gpu_uuid": p.gpu_uuid, "used_mib": round(p.used_mib), "name": p.name or "python"}
        for p in cluster.processes_at(state.ts) if p.host == host
    ]
    return {"host": host, "ts": state.ts, "gpus": gpus, "processes": procs}
