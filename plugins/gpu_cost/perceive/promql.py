"""PromQL building blocks shared by the Prometheus source and its recording rules.

The labels that identify one device, the selectors across exporter dialects (dcgm-exporter,
nvidia_gpu_exporter), and the helpers that label and union the parts of one query. Both
:mod:`gpu_cost.perceive.prometheus` (which asks) and :mod:`gpu_cost.perceive.recording` (which
writes the rules that pre-compute the answers) build their queries from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

#: labels that identify one device after normalisation: a GPU, or a MIG slice of it (dcgm-exporter's
#: ``GPU_I_ID``, the GPU instance; ``UUID`` and ``gpu`` stay the parent's)
KEY_LABELS = ("host", "gpu", "UUID", "GPU_I_ID")
#: extra labels read from the newest sample of each device
INFO_LABELS = ("modelName", "hpc_job", "pod", "namespace", "GPU_I_PROFILE")
#: the matcher of series that are no MIG slice's (the label absent)
WHOLE_GPU = 'GPU_I_ID=""'


def _dur(seconds: float) -> str:
    """Return a PromQL duration in milliseconds (exact for any window)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _sel(name: str, selector: str, offset: float = 0.0, extra: str = "") -> str:
    matchers = ",".join(m for m in (extra, selector) if m)
    text = f"{name}{{{matchers}}}" if matchers else name
    return f"{text} offset {_dur(offset)}" if offset else text


def _norm(expr: str) -> str:
    """Give every GPU series the labels ``host`` (Hostname, else the instance's host) and ``UUID``."""
    e = f'label_replace({expr}, "host", "$1", "instance", "(.+?)(?::[0-9]+)?")'
    e = f'label_replace({e}, "host", "$1", "hostname", "(.+)")'
    e = f'label_replace({e}, "host", "$1", "Hostname", "(.+)")'
    return f'label_replace({e}, "UUID", "$1", "uuid", "(.+)")'


def _by(expr: str, labels: Iterable[str] = KEY_LABELS) -> str:
    return f"max by ({', '.join(labels)}) ({_norm(expr)})"


def _stat(expr: str, name: str) -> str:
    return f'label_replace({expr}, "stat", "{name}", "", "")'


def _union(parts: Iterable[str]) -> str:
    """Return one query answering every part (each part's series carry their own ``stat``).

    Paired as a balanced tree, ``(a or b) or (c or d)``: ``or`` hashes the label sets of its left
    side, and a chain ``a or b or c …`` is left-nested, so the last parts' ``or`` hashes nearly
    every series of the answer again (about n²/2 times one part's series for n parts). The answer is
    the same, since no two parts share a ``stat``; at 1,000 GPUs the lookback query's evaluation
    took about a quarter less.
    """
    level = [f"({p})" for p in parts]
    while len(level) > 1:
        level = [f"({level[i]} or {level[i + 1]})" if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return level[0] if level else ""


class Dialects:
    """PromQL expressions for each signal, across exporter dialects (first one present wins)."""

    def __init__(self, selector: str = "", offset: float = 0.0) -> None:
        self.selector = selector
        self.offset = offset

    def s(self, name: str, extra: str = "") -> str:
        return _sel(name, self.selector, self.offset, extra)

    def util_raw(self) -> str:
        # device-level utilisation is not valid on a MIG slice: a slice's is its GPU instance's
        # GR_ENGINE_ACTIVE, so DCGM_FI_DEV_GPU_UTIL is read only where no GPU_I_ID label is set
        return (f"{self.s('DCGM_FI_PROF_GR_ENGINE_ACTIVE')} * 100 or {self.s('DCGM_FI_DEV_GPU_UTIL', WHOLE_GPU)}"
                f" or {self.s('nvidia_smi_utilization_gpu_ratio')} * 100")

    def util(self) -> str:
        """Utilisation % per GPU, invalid values dropped."""
        return f"({_by(self.util_raw())}) >= 0 <= 100"

    def mem_used(self) -> str:
        """Framebuffer used (MiB) per GPU, negative and absurd values dropped (as aggregate.clean)."""
        from gpu_cost.perceive.aggregate import MAX_MEM_MIB

        return (f"({_by(self.s('DCGM_FI_DEV_FB_USED') + ' or ' + self.s('nvidia_smi_memory_used_bytes') + ' / 1048576')})"
                f" >= 0 <= {MAX_MEM_MIB:.0f}")

    def mem_total(self) -> str:
        return _by(f"{self.s('DCGM_FI_DEV_FB_USED')} + {self.s('DCGM_FI_DEV_FB_FREE')}"
                   f" or {self.s('nvidia_smi_memory_total_bytes')} / 1048576")

    def power(self) -> str:
        return _by(f"{self.s('DCGM_FI_DEV_POWER_USAGE')} or {self.s('nvidia_smi_power_draw_watts')}")

    def temperature(self) -> str:
        return _by(f"{self.s('DCGM_FI_DEV_GPU_TEMP')} or {self.s('nvidia_smi_temperature_gpu')}")

    def newest(self, labels: Iterable[str] = KEY_LABELS) -> str:
        """Timestamp of each GPU's newest utilisation sample (raw sample time, not the query's)."""
        return _by(f"timestamp({self.s('DCGM_FI_PROF_GR_ENGINE_ACTIVE')}) or "
                   f"timestamp({self.s('DCGM_FI_DEV_GPU_UTIL', WHOLE_GPU)})"
                   f" or timestamp({self.s('nvidia_smi_utilization_gpu_ratio')})", labels)


def chart_buckets_query(lookback: float, bucket_max: Callable[[float, str], str]) -> str:
    """The chart's twelve parts ``chart_0`` (oldest) … ``chart_11``: ``bucket_max(bucket, shift)`` is the
    max over one bucket's length, ``shift`` the offset that moves it back to its place in the lookback."""
    from gpu_cost.perceive.aggregate import CHART_BUCKETS

    bucket = lookback / CHART_BUCKETS
    parts = []
    for k in range(CHART_BUCKETS):
        off = (CHART_BUCKETS - 1 - k) * bucket
        parts.append(_stat(bucket_max(bucket, f" offset {_dur(off)}" if off else ""), f"chart_{k}"))
    return _union(parts)
