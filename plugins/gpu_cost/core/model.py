"""The records that flow through the loop: perceive → analyse → decide → act → record.

Every arrow of the design is one of these plain values. GPU-level data is a DataFrame with the
columns listed in :data:`GPU_COLUMNS` (one row per GPU, aggregated over the rule window and the
lookback), because a 50,000-GPU cluster must not become 50,000 Python objects per sweep.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_cost.core import registry
from gpu_cost.core.perf import gc_paused

if TYPE_CHECKING:  # pandas is imported where used: DAG files import this module at parse time
    import pandas as pd

#: Columns of :attr:`Snapshot.gpus`, one row per GPU.
#: Window aggregates describe the rule window ending at the snapshot time; ``*_lb`` the lookback.
GPU_COLUMNS: dict[str, str] = {
    "host": "node name",
    "gpu": "GPU index on the node",
    "uuid": "GPU UUID (may be empty)",
    "model": "GPU model, e.g. a100",
    "label_job_id": "job id the exporter attached to the GPU (dcgm-exporter hpc_job), or empty",
    "util_mean": "mean utilisation % in the rule window",
    "util_max": "max utilisation % in the rule window",
    "mem_min_mib": "min framebuffer used (MiB) in the window",
    "mem_max_mib": "max framebuffer used (MiB) in the window",
    "mem_total_mib": "framebuffer size (MiB), NaN when unknown",
    "power_w": "mean power draw (W) in the window, NaN when unknown; a rule with a window of its own reads this one",
    "n_samples": "samples seen in the window",
    "expected_samples": "samples expected in the window at the sample interval",
    "last_ts": "epoch seconds of the newest sample",
    "util_mean_lb": "mean utilisation % over the lookback",
    "util_max_lb": "max utilisation % over the lookback",
    "busy_share_lb": "share of lookback samples above the busy threshold",
    "bursts_lb": "idle→busy transitions in the lookback (bursty services have several)",
    "n_lb": "samples seen in the lookback",
    "mem_slope_mib_h_lb": "least-squares slope of framebuffer used (MiB per hour) over the lookback's valid samples",
    "mem_r2_lb": "R² of that fit (1: steady growth); NaN when memory is constant or under 3 samples",
    "mem_span_s_lb": "seconds between the first and the last valid framebuffer sample in the lookback",
    "stale": "True when too few or too old samples: such a GPU never counts as idle",
    "util_chart_lb": "max utilisation % of each twelfth of the lookback, comma-separated (empty: no data): "
                     "the notices' chart",
}

#: Columns of each frame of :attr:`Snapshot.windows` (the aggregates over another window length, row for row with
#: ``gpus``): what a rule with a window of its own reads in place of the ``gpus`` column of that name. No
#: ``power_w``: every rule reads the GPUs' power over the primary window, the recent draw that says they work now
#: (no source measures a window's own, and a NaN there took the power sign of progress from such a rule).
WINDOW_COLUMNS: tuple[str, ...] = ("util_mean", "util_max", "mem_min_mib", "mem_max_mib", "n_samples",
                                   "expected_samples", "last_ts", "stale")

#: Columns a GPU frame has only when it shows MIG slices (absent: every row is a whole GPU, share 1).
#: A slice is a device of its own, keyed ``(host, gpu, mig)``; its parent's index stays in ``gpu``.
MIG_COLUMNS: dict[str, str] = {
    "mig": "MIG GPU instance id (dcgm-exporter GPU_I_ID) of a slice; empty for a whole GPU",
    "mig_profile": "MIG profile of a slice (dcgm-exporter GPU_I_PROFILE, e.g. 1g.10gb); empty for a whole GPU",
    "mig_uuid": "the slice's MIG device UUID (nvidia-smi -L, MIG-...) where a source knows it; else empty",
    "share": "the device's share of its physical GPU (1 for a whole GPU, 1/7 for a 1g slice): what it costs",
}

#: compute slices of a full MIG GPU (A100, H100, H200: 7) and memory slices (8)
MIG_COMPUTE_SLICES = 7
_MIG_MEMORY_SLICES = 8
#: memory slices a profile of N compute slices normally holds (1g: 1/8, 2g: 2/8, 3g and 4g: 4/8, 7g: all)
_MEM_TO_COMPUTE = {1: 1, 2: 2, 4: 3, 8: 7}
_PROFILE = re.compile(r"^(\d)g\.(\d+)gb(?:\+\w+)?$")


#: per record class: its field names, the same as a set, and a getter of their values
_FIELDS: dict[type, tuple[tuple[str, ...], frozenset[str], Callable[[Any], tuple[Any, ...]]]] = {}


def _layout(cls: type) -> tuple[tuple[str, ...], frozenset[str], Callable[[Any], tuple[Any, ...]]]:
    found = _FIELDS.get(cls)
    if found is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        get = operator.attrgetter(*names)
        found = _FIELDS[cls] = (names, frozenset(names), get if len(names) > 1 else lambda obj: (get(obj),))
    return found


def _field_set(cls: type) -> frozenset[str]:
    return _layout(cls)[1]


def _fields(obj: Any) -> dict[str, Any]:
    """Return a dataclass's fields by name, as :func:`dataclasses.asdict` gives them for these frozen
    records (numbers, strings and tuples of them), without its deep copy of every value: a 100k-GPU
    snapshot's 200,000 jobs took 18 s to copy before they were written as JSON."""
    names, _, get = _layout(type(obj))
    return dict(zip(names, get(obj), strict=True))


def mig_share(profile: str, parent_mem_gb: float | None = None) -> float:
    """Return the share of its GPU a MIG profile holds: ``1g.10gb`` → 1/7, ``3g.40gb`` → 3/7, ``7g.80gb`` → 1.

    Compute slices set the share; a memory-based variant that holds more memory than its compute
    slices normally carry (``1g.20gb`` on an 80 GB GPU: two eighths, as a 2g) costs what that
    memory's compute profile costs (2/7), when the parent's memory is known. Raises ValueError for
    a name that is not a MIG profile.
    """
    m = _PROFILE.match(profile.strip().lower())
    if not m or not 1 <= int(m.group(1)) <= MIG_COMPUTE_SLICES:
        raise ValueError(f"{profile!r} is not a MIG profile (like 1g.10gb)")
    compute = int(m.group(1))
    if compute >= MIG_COMPUTE_SLICES:
        return 1.0
    if parent_mem_gb and parent_mem_gb > 0:
        eighths = round(int(m.group(2)) / (parent_mem_gb / _MIG_MEMORY_SLICES))
        fits = [c for k, c in sorted(_MEM_TO_COMPUTE.items()) if k >= eighths]
        compute = max(compute, fits[0] if fits else MIG_COMPUTE_SLICES)
    return min(1.0, compute / MIG_COMPUTE_SLICES)


def device_id(host: str, gpu: int, mig: str = "") -> str:
    """Return the id findings use for a device: ``gpu01:3`` for a whole GPU, ``gpu01:3/mig2`` for a MIG slice."""
    return f"{host}:{int(gpu)}/mig{mig}" if mig else f"{host}:{int(gpu)}"


RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"})
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})


def empty_gpu_frame() -> pd.DataFrame:
    """Return an empty GPU frame with the documented columns."""
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype=_GPU_DTYPES.get(c, "float64")) for c in GPU_COLUMNS})


_GPU_DTYPES = {
    "host": "object",
    "gpu": "int64",
    "uuid": "object",
    "model": "object",
    "label_job_id": "object",
    "n_samples": "int64",
    "expected_samples": "int64",
    "n_lb": "int64",
    "bursts_lb": "int64",
    "stale": "bool",
    "util_chart_lb": "object",
    "mig": "object",
    "mig_profile": "object",
    "mig_uuid": "object",
}


@dataclass(frozen=True, slots=True)
class Job:
    """A scheduler job as the agent sees it.

    :param job_id: scheduler id (array tasks as ``123_4``).
    :param user: owner's user name.
    :param state: scheduler state, upper case (``RUNNING``, ``PENDING``, ``COMPLETED``...).
    :param gpu_alloc: per node, the GPU indices the job holds there.
    :param labels: agent labels taken from the comment (``gpu-cost:no-interrupt`` → ``no-interrupt``).
    """

    job_id: str
    user: str
    state: str = "RUNNING"
    start_ts: float | None = None
    account: str = ""
    partition: str = ""
    qos: str = ""
    name: str = ""
    comment: str = ""
    submit_ts: float | None = None
    end_ts: float | None = None
    time_limit_s: float | None = None
    nodes: tuple[str, ...] = ()
    gpu_alloc: tuple[tuple[str, tuple[int, ...]], ...] = ()
    gpus_requested: int = 0
    labels: tuple[str, ...] = ()
    priority: int | None = None
    nice: int | None = None
    #: Slurm's batch flag: False for salloc / srun outside a batch script (an interactive session); None unknown
    batch: bool | None = None
    #: the Slurm reservation the job runs (or waits) in; empty when none
    reservation: str = ""
    #: per node, the MIG slices the job holds there: ``<gpu>/<GPU instance id>`` or a MIG UUID
    #: (``MIG-...``, as the job's environment or cgroup device list names it); its ``gpu_alloc``
    #: entries on such a node count slices, not physical GPUs
    mig_alloc: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: the job holds its GPUs shared with other jobs (Slurm ``shard`` or ``mps`` gres, time-slicing)
    gpu_shared: bool = False

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def gpu_count(self) -> int:
        allocated = sum(len(idx) for _, idx in self.gpu_alloc)
        return allocated or self.gpus_requested

    @property
    def unplaced_gpus(self) -> int:
        """GPUs the job holds that no source places: ``gpus_requested`` beyond its known indices and MIG slices
        (an accounting export, a Slurm answer without GRES indices)."""
        placed = sum(len(idx) for _, idx in self.gpu_alloc) + sum(len(s) for _, s in self.mig_alloc)
        return max(0, self.gpus_requested - placed)

    def gpu_keys(self) -> list[tuple[str, int]]:
        """Return ``(host, index)`` for every GPU the job holds."""
        return [(host, i) for host, idx in self.gpu_alloc for i in idx]

    def mig_keys(self) -> list[tuple[str, str]]:
        """Return ``(host, slice)`` for every MIG slice the job holds (``slice``: ``<gpu>/<gi>`` or a MIG UUID)."""
        return [(host, s) for host, slices in self.mig_alloc for s in slices]

    def runtime_s(self, now: float) -> float:
        if self.start_ts is None:
            return 0.0
        end = self.end_ts if self.end_ts is not None and not self.running else now
        return max(0.0, min(end, now) - self.start_ts)

    def to_dict(self) -> dict[str, Any]:
        d = _fields(self)
        d["gpu_alloc"] = {h: list(i) for h, i in self.gpu_alloc}
        d["nodes"] = list(self.nodes)
        d["labels"] = list(self.labels)
        # present only when set, so a whole-GPU job's record reads as it always did
        if self.mig_alloc:
            d["mig_alloc"] = {h: list(s) for h, s in self.mig_alloc}
        else:
            d.pop("mig_alloc")
        if not self.gpu_shared:
            d.pop("gpu_shared")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Job:
        names = _field_set(cls)
        data = {k: v for k, v in d.items() if k in names}
        mig = data.get("mig_alloc")
        pairs = (mig.items() if isinstance(mig, Mapping) else mig) if mig else ()
        data["mig_alloc"] = tuple((h, tuple(str(x) for x in s)) for h, s in pairs)
        alloc = data.get("gpu_alloc")
        pairs = (alloc.items() if isinstance(alloc, Mapping) else alloc) if alloc else ()
        data["gpu_alloc"] = tuple((h, tuple(map(int, idx))) for h, idx in pairs)
        data["nodes"] = tuple(data.get("nodes") or ())
        data["labels"] = tuple(data.get("labels") or ())
        return cls(**data)


def labels_from_comment(comment: str, prefix: str = "gpu-cost:") -> tuple[str, ...]:
    """Return agent labels found in a job comment: ``"gpu-cost:no-interrupt x"`` → ``("no-interrupt",)``."""
    out = []
    for token in comment.replace(",", " ").split():
        if token.startswith(prefix) and len(token) > len(prefix):
            out.append(token[len(prefix):])
    return tuple(out)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU, as ``nvidia-smi`` and ``/proc`` on the node show it.

    :param start_ts: process start time (epoch seconds); with ``pid`` it identifies the process
        across PID reuse.
    :param job_id: the Slurm job owning the process (from its cgroup), or ``None`` for an orphan.
    :param job_known: False when the source cannot tell the process's job (a trace without job labels whose
        jobs file has no job holding the GPU when the process started: a job the export left out may own it);
        ``job_id`` is then ``None`` for want of knowing, not because it has none.
    """

    host: str
    pid: int
    gpu_uuid: str = ""
    gpu: int | None = None
    used_mib: float = 0.0
    start_ts: float | None = None
    job_id: str | None = None
    container: str | None = None
    user: str = ""
    name: str = ""
    #: the MIG GPU instance id the process runs in, when known (its ``gpu_uuid`` may be the slice's MIG UUID)
    mig: str = ""
    #: the MIG profile of the slice it runs in (``nvidia-smi -L``), when its ``gpu_uuid`` is a MIG UUID
    mig_profile: str = ""
    job_known: bool = True

    @property
    def key(self) -> str:
        start = "" if self.start_ts is None else str(int(self.start_ts))
        return f"proc:{self.host}:{self.pid}:{start}"

    def to_dict(self) -> dict[str, Any]:
        d = _fields(self)
        for k in ("mig", "mig_profile"):
            if not d[k]:
                d.pop(k)  # a whole-GPU process's record reads as it always did
        if d["job_known"]:
            d.pop("job_known")  # so does one whose job the source tells
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuProcess:
        names = _field_set(cls)
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True, slots=True)
class Node:
    """A compute node.

    :param state: scheduler state, lower case with flags (``idle``, ``mixed``, ``allocated``,
        ``idle~`` for powered down, ``down``, ``drained``...).
    """

    name: str
    state: str = "idle"
    gpus_total: int = 0
    gpus_alloc: int = 0
    gpu_model: str = ""
    partitions: tuple[str, ...] = ()
    cpu_util: float | None = None
    power_w: float | None = None
    reason: str = ""
    #: network and disk bytes per second (node_exporter), None when unknown
    io_bps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = _fields(self)
        d["partitions"] = list(self.partitions)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Node:
        data = dict(d)
        data["partitions"] = tuple(data.get("partitions") or ())
        names = _field_set(cls)
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class Reservation:
    """A Slurm reservation (``scontrol show reservation``): nodes held for some accounts or users.

    :param state: ``ACTIVE`` (started) or ``INACTIVE`` (starts later), as Slurm says.
    :param flags: Slurm's flags, upper case (``MAINT``, ``IGNORE_JOBS``...).
    :param made_by_agent: the audit store records the agent's own ``reserve`` of this very
        reservation (:func:`gpu_cost.capacity.reservations.mark_own`); no source sets it.
    """

    name: str
    start_ts: float
    end_ts: float
    nodes: tuple[str, ...] = ()
    node_count: int = 0
    state: str = "ACTIVE"
    accounts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    partition: str = ""
    flags: tuple[str, ...] = ()
    made_by_agent: bool = False

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    def to_dict(self) -> dict[str, Any]:
        d = _fields(self)
        for k in ("nodes", "accounts", "users", "flags"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reservation:
        data = dict(d)
        for k in ("nodes", "accounts", "users", "flags"):
            data[k] = tuple(data.get(k) or ())
        names = _field_set(cls)
        return cls(**{k: v for k, v in data.items() if k in names})


#: whose a reservation is, as the idle-reservation rule found it (``evidence["standing"]``): the agent's
#: own (its name prefix and its audit row), someone else's the policy lets it release with a human's
#: approval (``rules.idle_reservation.release_foreign``), anyone else's (notices only)
AGENT, OPTED_IN, FOREIGN = "agent", "opted_in", "foreign"


def reservation_standing(target_kind: str, evidence: Mapping[str, Any]) -> str | None:
    """Return whose reservation a finding or decision is about (:data:`AGENT`, :data:`OPTED_IN` or
    :data:`FOREIGN`); None for another kind of target. One whose evidence does not say is :data:`FOREIGN`."""
    if target_kind != "reservation":
        return None
    said = evidence.get("standing")
    return said if said in (AGENT, OPTED_IN) else FOREIGN


@dataclass(frozen=True, slots=True)
class Disagreement:
    """Two sources tell different stories about one GPU; the snapshot says so instead of guessing."""

    host: str
    gpu: int
    what: str

    def to_dict(self) -> dict[str, Any]:
        return _fields(self)


class GpuColumns:
    """A snapshot's GPU rows (or its :meth:`Snapshot.view` over another window) as NumPy columns, each read from the
    frame once and shared by every reader of the sweep: the rules, the class baselines and the usage record read the
    same dozen columns, and at a few hundred GPUs a pandas column read costs more than the arithmetic on it.

    ``get(name, dtype)`` is ``frame[name].to_numpy(dtype=dtype)``, with a window's own column in place of the
    frame's. The arrays are read-only: change a copy.
    """

    __slots__ = ("_arrays", "_extra", "_frame")

    def __init__(self, frame: pd.DataFrame, extra: pd.DataFrame | None = None) -> None:
        self._frame, self._extra = frame, extra
        self._arrays: dict[tuple[str, Any], Any] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._frame or (self._extra is not None and name in self._extra)

    def __len__(self) -> int:
        return len(self._frame)

    @property
    def empty(self) -> bool:
        """True when there are no GPU rows (or no columns), as the frame says it."""
        return bool(self._frame.empty)

    def ours(self) -> Any:
        """Return which rows are the cluster's GPUs, as a read-only boolean array: all but those attributed ``outside``
        (a host outside the scheduler, :func:`gpu_cost.perceive.correlate.attribute`: an inference server or a
        workstation the same Prometheus scrapes), which no count, average or warning of the cluster's takes in."""
        found = self._arrays.get(("attribution", "ours"))
        if found is None:
            if "attribution" in self:
                found = self.get("attribution", object) != "outside"
            else:
                import numpy as np

                found = np.ones(len(self), dtype=bool)
            found.flags.writeable = False
            self._arrays[("attribution", "ours")] = found
        return found

    def get(self, name: str, dtype: Any = None) -> Any:
        """Return column ``name`` as a read-only array of ``dtype`` (KeyError when the frame lacks it)."""
        key = (name, dtype)
        found = self._arrays.get(key)
        if found is None:
            source = self._extra if self._extra is not None and name in self._extra else self._frame
            found = source[name].to_numpy(dtype=dtype)
            found.flags.writeable = False
            self._arrays[key] = found
        return found


@dataclass(slots=True)
class Snapshot:
    """What the agent sees at one instant: GPUs (aggregated), jobs, processes, nodes.

    :param ts: the instant (epoch seconds, end of the rule window).
    :param gpus: one row per GPU, columns :data:`GPU_COLUMNS` plus ``job_id`` and ``attribution``
        once :func:`gpu_cost.perceive.correlate.attribute` has run.
    :param problems: reasons the data is incomplete; a snapshot with problems is *degraded* and
        nothing destructive is decided from it.
    """

    ts: float
    window_s: float
    lookback_s: float
    source: str
    gpus: pd.DataFrame
    jobs: tuple[Job, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    nodes: tuple[Node, ...] = ()
    problems: tuple[str, ...] = ()
    disagreements: tuple[Disagreement, ...] = ()
    sample_interval_s: float = 60.0
    #: window columns for other window lengths (seconds → frame aligned with ``gpus``)
    windows: dict[float, pd.DataFrame] = field(default_factory=dict)
    #: job id → the tail of its log as read for this snapshot (:mod:`gpu_cost.analyse.evidence`): ``text``,
    #: ``size``, ``mtime``, ``path``, or ``error`` when it could not be read
    job_logs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: job id → its class baseline (:mod:`gpu_cost.analyse.baselines`): ``key``, ``members``, ``kind``, shares, run times
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Slurm reservations (empty when the source has none or could not read them)
    reservations: tuple[Reservation, ...] = ()
    #: indexes the rules ask for per candidate, each with the tuple it was built from (:meth:`jobs_by_node`)
    _indexes: dict[str, tuple[Any, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def view(self, window_s: float) -> pd.DataFrame:
        """Return ``gpus`` with its window columns computed over ``window_s`` instead.

        Like ``gpus`` itself, the frame is shared: every rule with that window reads the one built while ``gpus``
        and the window's columns are the same objects. Read it; do not change it.
        """
        if abs(window_s - self.window_s) < 1e-6 or window_s not in self.windows:
            if abs(window_s - self.window_s) >= 1e-6:
                raise KeyError(f"snapshot has no aggregates for a {window_s:g}s window")
            return self.gpus
        extra = self.windows[window_s]
        views: dict[float, tuple[pd.DataFrame, pd.DataFrame]] = self.memo("views", self.gpus, dict)
        made = views.get(window_s)
        if made is None or made[0] is not extra:
            out = self.gpus.copy(deep=False)  # copy-on-write: the columns set below are the view's own
            for col in extra.columns:
                out[col] = extra[col].to_numpy()
            made = views[window_s] = (extra, out)
        return made[1]

    def columns(self, window_s: float | None = None) -> GpuColumns:
        """Return :meth:`view`'s columns (``window_s``; None: the snapshot's own window) as NumPy arrays, each read
        once while ``gpus`` and the window's columns are the same objects (:class:`GpuColumns`).

        Like the frame, they are read, never changed: a snapshot is not edited once built (change a copy of its
        frame, ``dataclasses.replace(snapshot, gpus=...)``)."""
        extra = None
        if window_s is not None and abs(window_s - self.window_s) >= 1e-6:
            if window_s not in self.windows:
                raise KeyError(f"snapshot has no aggregates for a {window_s:g}s window")
            extra = self.windows[window_s]
        made: dict[float | None, GpuColumns] = self.memo("columns", self.gpus, dict)
        key = None if extra is None else window_s
        found = made.get(key)
        if found is None or found._extra is not extra:
            found = made[key] = GpuColumns(self.gpus, extra)
        return found

    @property
    def degraded(self) -> bool:
        return bool(self.problems)

    def gpu_count(self) -> int:
        """Return the cluster's GPUs as this snapshot shows them: GPUs in the metrics, else Slurm's GRES (0: unknown).
        GPUs outside the scheduler (attributed ``outside``: an inference server the same Prometheus scrapes) are
        not the cluster's: counted, they would loosen every cap on a share of it."""
        return _gpu_count(len(self.gpus) - self.outside_count(), (n.gpus_total for n in self.nodes))

    def outside_count(self) -> int:
        """Return how many GPU rows are outside the scheduler (attributed ``outside``): read, judged by nothing."""
        if not len(self.gpus):
            return 0
        return len(self.gpus) - int(self.columns().ours().sum())

    @classmethod
    def gpu_count_of_json(cls, text: str) -> int:
        """Return :meth:`gpu_count` of the snapshot :meth:`to_json` wrote, reading only its GPU rows and its nodes'
        GPUs: an act step asks it of a 140 MB text at 100k GPUs (0.13 s, where reading it all takes 5 s)."""
        import msgspec

        try:
            doc = _count_decoder().decode(text)
        except msgspec.DecodeError:
            return cls.from_json(text).gpu_count()  # an older writer's NaN: read it all
        rows = len(doc.gpus.data)
        if "attribution" in doc.gpus.columns and '"outside"' in text:  # those rows read whole
            at = doc.gpus.columns.index("attribution")
            rows -= sum(1 for raw in doc.gpus.data
                        if b'"outside"' in bytes(raw) and msgspec.json.decode(raw)[at] == "outside")
        return _gpu_count(rows, (n.gpus_total for n in doc.nodes))

    def running_jobs(self) -> list[Job]:
        """Return the running jobs: a new list each call, filtered once per ``jobs`` (every rule asks)."""
        return list(self.memo("running_jobs", self.jobs, lambda: [j for j in self.jobs if j.running]))

    def pending_jobs(self) -> list[Job]:
        return [j for j in self.jobs if j.pending]

    def jobs_by_node(self) -> dict[str, set[str]]:
        """Return node → ids of the running jobs on it, built once per ``jobs`` (rules ask it per candidate)."""

        def build() -> dict[str, set[str]]:
            out: dict[str, set[str]] = {}
            for j in self.running_jobs():
                for n in j.nodes or [h for h, _ in j.gpu_alloc]:
                    out.setdefault(n, set()).add(j.job_id)
            return out

        index: dict[str, set[str]] = self.memo("jobs_by_node", self.jobs, build)
        return index  # shared: read it, do not change it

    def memo(self, name: str, basis: Any, build: Callable[[], Any]) -> Any:
        """Return ``build()``'s value, built once while ``basis`` (the object it reads) is the same object: the
        indexes the rules ask per candidate (:meth:`jobs_by_node`, :func:`gpu_cost.analyse.jobrows.job_index`)."""
        cached = self._indexes.get(name)
        if cached is None or cached[0] is not basis:
            cached = self._indexes[name] = (basis, build())
        return cached[1]

    def nodes_named(self, names: Iterable[str]) -> list[Node]:
        """Return the nodes called ``names``, in the snapshot's order (the index is built once per ``nodes``)."""

        def build() -> dict[str, list[int]]:
            index: dict[str, list[int]] = {}
            for i, n in enumerate(self.nodes):
                index.setdefault(n.name, []).append(i)
            return index

        index: dict[str, list[int]] = self.memo("nodes", self.nodes, build)
        return [self.nodes[i] for i in sorted(i for name in set(names) for i in index.get(name, ()))]

    def job(self, job_id: str) -> Job | None:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        return None

    def to_json(self) -> str:
        """Return the snapshot as compact JSON (the audit store parks it for the run's later tasks).

        Written by :func:`gpu_cost.core.jsontext.dumps`, the frames as pandas writes them (``split``,
        missing values ``null``): a number that is not finite is ``null`` too, which :meth:`from_json`
        reads back as None, "not known". A 100k-GPU snapshot is 140 MB of it.
        """
        from gpu_cost.core import jsontext

        with gc_paused():  # the records' dicts too: hundreds of thousands of them
            return jsontext.dumps({
                "ts": self.ts,
                "window_s": self.window_s,
                "lookback_s": self.lookback_s,
                "source": self.source,
                "sample_interval_s": self.sample_interval_s,
                "gpus": jsontext.raw(self.gpus.to_json(orient="split", index=False)),
                "jobs": [j.to_dict() for j in self.jobs],
                "processes": [p.to_dict() for p in self.processes],
                "nodes": [n.to_dict() for n in self.nodes],
                "problems": list(self.problems),
                "disagreements": [d.to_dict() for d in self.disagreements],
                "windows": {str(k): jsontext.raw(v.to_json(orient="split", index=False))
                            for k, v in self.windows.items()},
                "job_logs": self.job_logs,
                "classes": self.classes,
                "reservations": [r.to_dict() for r in self.reservations],
            })

    @classmethod
    @gc_paused()
    def from_json(cls, text: str) -> Snapshot:
        import pandas as pd

        from gpu_cost.core import jsontext

        d = jsontext.loads(text)
        g = d["gpus"]
        gpus = _typed(pd.DataFrame(g["data"], columns=g["columns"]))
        if gpus.empty and not len(gpus.columns):
            gpus = empty_gpu_frame()
        return cls(
            ts=d["ts"],
            window_s=d["window_s"],
            lookback_s=d["lookback_s"],
            source=d["source"],
            sample_interval_s=d.get("sample_interval_s", 60.0),
            gpus=gpus,
            jobs=tuple(Job.from_dict(j) for j in d["jobs"]),
            processes=tuple(GpuProcess.from_dict(p) for p in d["processes"]),
            nodes=tuple(Node.from_dict(n) for n in d["nodes"]),
            problems=tuple(d["problems"]),
            disagreements=tuple(Disagreement(**x) for x in d["disagreements"]),
            windows={
                float(k): _typed(pd.DataFrame(v["data"], columns=v["columns"])) for k, v in d.get("windows", {}).items()
            },
            job_logs=dict(d.get("job_logs") or {}),
            classes=dict(d.get("classes") or {}),
            reservations=tuple(Reservation.from_dict(r) for r in d.get("reservations") or ()),
        )


def _gpu_count(rows: int, node_gpus: Iterable[int | None]) -> int:
    """:meth:`Snapshot.gpu_count` of a snapshot's GPU rows (those outside the scheduler left out) and its nodes'
    GPUs (Slurm's GRES)."""
    return max(rows, sum(int(n or 0) for n in node_gpus))


#: the decoder of :meth:`Snapshot.gpu_count_of_json` (made on first use: msgspec is not imported at DAG parse)
_COUNT_DECODER: list[Any] = []


def _count_decoder() -> Any:
    if not _COUNT_DECODER:
        import msgspec

        # the GPU rows left undecoded, each node's GPUs alone; every other key is skipped, not built
        rows = msgspec.defstruct("Rows", [("columns", list[str], msgspec.field(default_factory=list)),
                                          ("data", list[msgspec.Raw], msgspec.field(default_factory=list))])
        node = msgspec.defstruct("NodeGpus", [("gpus_total", int | None, 0)])
        counted = msgspec.defstruct("Counted", [("gpus", rows, msgspec.field(default_factory=rows)),
                                                ("nodes", list[node], msgspec.field(default_factory=list))])  # type: ignore[valid-type]
        _COUNT_DECODER.append(msgspec.json.Decoder(counted))
    return _COUNT_DECODER[0]


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    for col in frame.columns:
        dtype = _GPU_DTYPES.get(col)
        if dtype is not None and dtype != "object":
            frame[col] = frame[col].astype(dtype)
        elif dtype == "object" or col in ("job_id", "attribution"):
            values = frame[col].astype(object)
            frame[col] = values.where(values.notna(), None)
    if "label_job_id" in frame.columns:
        frame["label_job_id"] = frame["label_job_id"].fillna("")
    return frame


@dataclass(frozen=True, slots=True)
class Finding:
    """One piece of waste a rule found.

    :param target: stable key of what is wasteful: ``job:<id>``, ``proc:<host>:<pid>:<start>``,
        ``gpu:<host>:<index>``, ``node:<name>`` or ``reservation:<name>``.
    :param gpus: number of GPUs the waste holds.
    :param action: what the rule suggests; the policy decides what is actually done.
    :param inference: the target looks like (or is declared as) an inference service.
    """

    rule: str
    target_kind: str
    target: str
    action: str
    gpus: int
    job_id: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    name: str | None = None
    host: str | None = None
    gpu_ids: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    inference: bool = False
    job_start_ts: float | None = None
    time_limit_s: float | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    #: whole-GPU equivalents the waste holds when it is MIG slices (``gpus`` counts devices); None: ``gpus``
    gpu_share: float | None = None

    @property
    def gpu_equivalents(self) -> float:
        """Return what the finding's devices cost in whole GPUs (a 1g.10gb slice: 1/7)."""
        return float(self.gpus) if self.gpu_share is None else float(self.gpu_share)

    def to_dict(self) -> dict[str, Any]:
        d = _fields(self)
        if self.gpu_share is None:
            d.pop("gpu_share")
        d["gpu_ids"] = list(self.gpu_ids)
        d["labels"] = list(self.labels)
        d["nodes"] = list(self.nodes)
        d["evidence"] = dict(self.evidence)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Finding:
        data = dict(d)
        for k in ("gpu_ids", "labels", "nodes"):
            data[k] = tuple(data.get(k) or ())
        names = _field_set(cls)
        return cls(**{k: v for k, v in data.items() if k in names})


# Action names and properties are declared once, by the executor modules (gpu_cost.core.registry);
# these names are live views of that registry, kept for the modules that import them.
#: Actions a decision may carry, mildest first.
ACTIONS = registry.Names(extra=("none",))
#: Actions that take resources away from someone.
DESTRUCTIVE_ACTIONS = registry.names(destructive=True)
#: Actions that end a job or a process.
KILL_ACTIONS = registry.names(ends_job=True)
#: The policy's modes, mildest first: what a run, or a decision, was allowed to do (``mode`` of
#: ``gpu_cost_runs`` and ``gpu_cost_decisions``; ``Mode`` in :mod:`gpu_cost.config.schema` spells the same).
#: Never what happened to a run: that is its status (:data:`RUN_STATUSES`).
MODES = ("dry-run", "notify", "enforce")
#: What happened to a run (``status`` of ``gpu_cost_runs``): ``running`` until its first event (the
#: view's default, never written), then ``awaiting_approval``, and how it ended: ``ok``, ``degraded``
#: (decided on partial data), ``stale`` (no fresh metrics), ``capped`` (a cap stopped it), ``rejected``
#: (the approver said no), ``refused`` (a manual request refused before anything was decided), ``failed``.
RUN_STATUSES = ("running", "awaiting_approval", "ok", "degraded", "stale", "capped", "rejected", "refused", "failed")


def decision_id(rule: str, target: str, episode: int, rung: int, track: str = "live") -> str:
    """Return the deterministic id of a decision: the same inputs always give the same id.

    ``track`` separates what is really done (``live``) from what is only recorded (``dry-run``,
    or ``shadow`` for a rung held back by the mode or by degraded data), so switching modes never
    makes a recorded-only decision collide with a real one.
    """
    raw = f"{rule}|{target}|{episode}|{rung}|{track}".encode()
    return hashlib.sha256(raw).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class Decision:
    """What the policy decided for one finding in one run.

    :param mode: the mode the decision was taken in; ``dry-run`` decisions are recorded, never acted on.
    :param rung: the escalation rung (0 = first warning); ``episode`` counts idle periods of the target.
    :param requires_approval: a human must approve before the action runs.
    :param gpu_hours_at_risk: work lost if the decision is wrong (GPUs × time the job has run).
    :param gpu_hours_saved: GPU time freed if it is right (GPUs × time until predicted end or limit).
    """

    decision_id: str
    ts: float
    rule: str
    target_kind: str
    target: str
    action: str
    mode: str
    rung: int = 0
    episode: int = 1
    job_id: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    host: str | None = None
    gpus: int = 0
    reason: str = ""
    protection: str | None = None
    requires_approval: bool = False
    gpu_hours_at_risk: float = 0.0
    gpu_hours_saved: float = 0.0
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def acts(self) -> bool:
        """True when the decision leads to an effect (not dry-run, not ``none``)."""
        return self.mode != "dry-run" and self.action != "none"

    @property
    def destructive(self) -> bool:
        return self.action in DESTRUCTIVE_ACTIONS

    def to_dict(self) -> dict[str, Any]:
        d = _fields(self)
        d["evidence"] = dict(self.evidence)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        names = _field_set(cls)
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Decision:
        """Return the decision a ``gpu_cost_decisions`` row stores (the audit store's column names)."""
        import json

        ev = row.get("evidence")
        return cls(
            decision_id=row["decision_id"], ts=float(row["ts"]), rule=row["rule"], target_kind=row["target_kind"],
            target=row["target"], action=row["action"], mode=row["mode"], rung=int(row["rung"] or 0),
            episode=int(row["episode"] or 1), job_id=row.get("job_id"), user=row.get("user_name"),
            account=row.get("account"), partition=row.get("partition_name"), host=row.get("host"),
            gpus=int(row.get("gpus") or 0), reason=row.get("reason") or "", protection=row.get("protection"),
            requires_approval=bool(row.get("requires_approval")),
            gpu_hours_at_risk=float(row.get("gpu_hours_at_risk") or 0),
            gpu_hours_saved=float(row.get("gpu_hours_saved") or 0),
            evidence=json.loads(ev) if isinstance(ev, str) and ev else dict(ev or {}),
        )

    def summary(self) -> dict[str, Any]:
        """Return the small dict the CLI and XCom carry."""
        return {
            "decision_id": self.decision_id,
            "rule": self.rule,
            "target": self.target,
            "job_id": self.job_id,
            "user": self.user,
            "action": self.action,
            "mode": self.mode,
            "rung": self.rung,
            "requires_approval": self.requires_approval,
            "reason": self.reason,
        }


def as_findings(items: Iterable[Mapping[str, Any] | Finding]) -> list[Finding]:
    return [i if isinstance(i, Finding) else Finding.from_dict(i) for i in items]


def as_decisions(items: Iterable[Mapping[str, Any] | Decision]) -> list[Decision]:
    return [i if isinstance(i, Decision) else Decision.from_dict(i) for i in items]
