"""GPU and node metrics from Prometheus: DCGM (dcgm-exporter), nvidia_gpu_exporter, node_exporter.

Every aggregate is computed *in PromQL*, so a sweep costs a constant number of queries whatever
the cluster size (:attr:`PrometheusSource.queries_made` counts them):

1. ``current``   — per GPU: newest sample time, identity labels (``Hostname``/``instance``, ``gpu``,
   ``UUID``, ``modelName``, ``hpc_job``, ``pod``, ``namespace``), framebuffer size, temperature;
2. ``windows``   — per GPU and rule window: mean/max utilisation, min/max framebuffer used, sample
   count, mean power;
3. ``lookback``  — per GPU over the lookback: mean/max utilisation, busy share, idle→busy bursts,
   sample count, and the framebuffer's trend (``deriv`` slope, R², span: a leak grows steadily);
4. ``nodes``     — per node from node_exporter: CPU busy %, memory available, disk, network.

Where the recording rules of :mod:`gpu_cost.sources.recording` (shipped in
``deploy/prometheus/gpu-cost.rules.yml``) run on the server and fit the policy, ``windows`` and
``lookback`` read their series instead of the raw ones: same answers, a fraction of the samples.
``current`` says whether they do (:attr:`PrometheusSource.rules_used`). ``windows`` and
``lookback`` do not depend on each other and are sent at the same time (Prometheus evaluates each
query on a core of its own), after ``current``, which decides how to ask them.

Series are resampled on the policy's ``sample_interval`` grid with subqueries
(``avg_over_time(U[15m:60s])``), which gives exactly the samples :mod:`gpu_cost.aggregate` sees
for the simulator and traces, so ``stale`` and ``bursts_lb`` mean the same thing for every
source. Utilisation prefers ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a 0-1 ratio, scaled to %), falls
back to ``DCGM_FI_DEV_GPU_UTIL`` and then to nvidia_gpu_exporter's
``nvidia_smi_utilization_gpu_ratio``. Values outside 0-100 % are dropped, never read as idle;
framebuffer readings below 0 or above ``aggregate.MAX_MEM_MIB`` are dropped, never read as held.

The server comes from the Airflow connection ``gpu_cost_prometheus`` (``AIRFLOW_CONN_GPU_COST_PROMETHEUS``
as a URI or JSON, or Airflow's own lookup), else ``GPU_COST_PROMETHEUS_URL``. Connection extras:
``selector`` (label matchers added to every GPU selector, e.g. ``job="dcgm"``), ``node_selector``
(the same for node_exporter), ``timeout`` (seconds), ``verify`` (TLS), ``headers``,
``recording_rules`` (``false``: never read the recording rules' series). A server that
cannot be reached, times out or answers nonsense raises :class:`~gpu_cost.errors.SourceError`;
a GPU missing from some answers is *stale*, never idle. Errors name the server with its
credentials redacted (:func:`gpu_cost.redact.redact`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_cost import connections
from gpu_cost.errors import SourceError
from gpu_cost.redact import redact

logger = logging.getLogger(__name__)

CONN_ID = "gpu_cost_prometheus"
URL_ENV = "GPU_COST_PROMETHEUS_URL"

#: labels that identify one device after normalisation: a GPU, or a MIG slice of it (dcgm-exporter's
#: ``GPU_I_ID``, the GPU instance; ``UUID`` and ``gpu`` stay the parent's)
KEY_LABELS = ("host", "gpu", "UUID", "GPU_I_ID")
#: extra labels read from the newest sample of each device
INFO_LABELS = ("modelName", "hpc_job", "pod", "namespace", "GPU_I_PROFILE")
#: the matcher of series that are no MIG slice's (the label absent)
WHOLE_GPU = 'GPU_I_ID=""'



# ---------------------------------------------------------------------------------------------
# connection


@dataclass(frozen=True, repr=False)
class PromConfig:
    """Where Prometheus is and how to read it.

    :param selector: label matchers (without braces) added to every GPU metric selector.
    :param node_selector: the same for node_exporter metrics.
    :param recording_rules: read :mod:`gpu_cost.sources.recording`'s series where they fit (False: raw only).
    """

    url: str
    selector: str = ""
    node_selector: str = ""
    timeout: float = 15.0
    verify: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)
    auth: tuple[str, str] | None = None
    recording_rules: bool = True

    def __repr__(self) -> str:
        # a repr lands in logs and tracebacks: no password, no Authorization header
        return (f"PromConfig(url={redact(self.url)!r}, selector={self.selector!r}, node_selector={self.node_selector!r}, "
                f"timeout={self.timeout!r}, verify={self.verify!r}, headers={sorted(self.headers)!r}, "
                f"auth={'(***)' if self.auth else None}, recording_rules={self.recording_rules!r})")


def configured(conn_id: str = CONN_ID) -> bool:
    """Return True when a Prometheus server is configured (without contacting it)."""
    try:
        prometheus_config(conn_id)
    except SourceError:
        return False
    return True


def prometheus_config(conn_id: str = CONN_ID) -> PromConfig:
    """Return the configuration of the Prometheus server the agent reads."""
    conn = connections.lookup(conn_id, SourceError)
    if conn is not None:
        return _config_from_conn(conn, conn_id)
    url = os.environ.get(URL_ENV)
    if url:
        return PromConfig(url=url.rstrip("/"))
    raise SourceError(f"no Prometheus configured: set the Airflow connection {conn_id} "
                      f"({connections.env_var(conn_id)}) or {URL_ENV}")


def _config_from_conn(conn: Mapping[str, Any], conn_id: str) -> PromConfig:
    extra = conn.get("extra") or {}
    host = str(conn.get("host") or "")
    if not host:
        raise SourceError(f"connection {conn_id}: no host")
    if "://" in host:
        url = host.rstrip("/")
    else:
        ctype = str(conn.get("conn_type") or "http").lower()
        scheme = "https" if ctype == "https" or str(conn.get("schema") or "") == "https" else "http"
        port = f":{conn['port']}" if conn.get("port") else ""
        url = f"{scheme}://{host}{port}"
    try:
        timeout = float(extra.get("timeout", 15))
    except (TypeError, ValueError):
        raise SourceError(f"connection {conn_id}: extra.timeout must be a number of seconds") from None
    selector = str(extra.get("selector", "")).strip().strip("{}")
    node_selector = str(extra.get("node_selector", "")).strip().strip("{}")
    verify = str(extra.get("verify", "true")).lower() not in ("false", "0", "no")
    rules = str(extra.get("recording_rules", "true")).lower() not in ("false", "0", "no")
    headers = extra.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise SourceError(f"connection {conn_id}: extra.headers must be a mapping")
    auth = (str(conn["login"]), str(conn.get("password") or "")) if conn.get("login") else None
    return PromConfig(url=url, selector=selector, node_selector=node_selector, timeout=timeout, verify=verify,
                      headers={str(k): str(v) for k, v in headers.items()}, auth=auth, recording_rules=rules)


# ---------------------------------------------------------------------------------------------
# PromQL


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
        from gpu_cost.aggregate import MAX_MEM_MIB

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


def current_query(selector: str, rules_lookback: float | None = None) -> str:
    """Newest sample time with identity labels, framebuffer size, temperature, nvidia-smi index/name.

    With ``rules_lookback``, also the recording rules' info series now (``stat="rules"``) and one
    lookback ago (``stat="rules_since"``): whether :mod:`gpu_cost.sources.recording`'s series can
    stand in for the raw ones, asked in the query the sweep makes anyway.
    """
    d = Dialects(selector)
    rules = []
    if rules_lookback is not None:
        from gpu_cost.sources.recording import INFO

        # the value is the rules' last evaluation time: their series are read as of then
        rules = [_stat(f"timestamp({INFO})", "rules"), _stat(f"{INFO} offset {_dur(rules_lookback)}", "rules_since")]
    return _union([
        *rules,
        _stat(d.newest((*KEY_LABELS, *INFO_LABELS)), "last_ts"),
        _stat(d.mem_total(), "mem_total"),
        _stat(d.temperature(), "temp"),
        _stat(_by(d.s("nvidia_smi_index")), "index"),
        _stat(_by(d.s("nvidia_smi_gpu_info"), (*KEY_LABELS, "name")), "info"),
    ])


def windows_query(selector: str, windows: Iterable[float], primary: float, step: float) -> str:
    """Window aggregates for every rule window, on the sample-interval grid."""
    d = Dialects(selector)
    s = _dur(step)
    parts = []
    for w in windows:
        r = _dur(w - step / 2)  # steps t in (now - w, now], as aggregate.window_stats
        tag = f"{w:g}"
        parts += [
            _stat(f"avg_over_time(({d.util()})[{r}:{s}])", f"util_mean@{tag}"),
            _stat(f"max_over_time(({d.util()})[{r}:{s}])", f"util_max@{tag}"),
            _stat(f"count_over_time(({d.util()})[{r}:{s}])", f"n@{tag}"),
            _stat(f"min_over_time(({d.mem_used()})[{r}:{s}])", f"mem_min@{tag}"),
            _stat(f"max_over_time(({d.mem_used()})[{r}:{s}])", f"mem_max@{tag}"),
        ]
        if abs(w - primary) < 1e-6:
            parts.append(_stat(f"avg_over_time(({d.power()})[{r}:{s}])", f"power@{tag}"))
    return _union(parts)


def lookback_query(selector: str, lookback: float, step: float, busy: float) -> str:
    """Lookback aggregates: mean/max, busy share, idle→busy bursts (as aggregate.lookback_stats),
    and the framebuffer's trend (as aggregate.mem_trend_stats).

    The trend's parts, on the same sample grid: ``deriv`` (the least-squares slope, MiB/s, here ×
    3600), the variances of the memory and of its sample times (``timestamp`` of an expression is
    the subquery step's time), their count and the first and last sample time. The source puts
    them together as R² = slope² × var(t) / var(y) and span = last - first (:func:`mem_trend`).
    """
    d = Dialects(selector)
    prev = Dialects(selector, offset=step)
    s = _dur(step)
    r = _dur(lookback - step / 2)
    rb = _dur(lookback - 3 * step / 2)  # a burst needs its quiet sample inside the lookback too
    burst = f"(({d.util()}) > {busy:g}) and (({prev.util()}) < {busy / 4.0:g})"
    mem = d.mem_used()
    t = f"timestamp({mem})"
    return _union([
        _stat(f"avg_over_time(({d.util()})[{r}:{s}])", "util_mean_lb"),
        _stat(f"max_over_time(({d.util()})[{r}:{s}])", "util_max_lb"),
        _stat(f"count_over_time(({d.util()})[{r}:{s}])", "n_lb"),
        _stat(f"avg_over_time((({d.util()}) > bool {busy:g})[{r}:{s}])", "busy_share_lb"),
        _stat(f"count_over_time(({burst})[{rb}:{s}])", "bursts_lb"),
        _stat(f"deriv(({mem})[{r}:{s}]) * 3600", "mem_slope_lb"),
        _stat(f"stdvar_over_time(({mem})[{r}:{s}])", "mem_var_lb"),
        _stat(f"stdvar_over_time(({t})[{r}:{s}])", "mem_tvar_lb"),
        _stat(f"count_over_time(({mem})[{r}:{s}])", "mem_n_lb"),
        _stat(f"min_over_time(({t})[{r}:{s}])", "mem_t0_lb"),
        _stat(f"max_over_time(({t})[{r}:{s}])", "mem_t1_lb"),
        *chart_parts(d, lookback, step),
    ])


def chart_parts(d: Dialects, lookback: float, step: float) -> list[str]:
    """The notices' utilisation chart: the max of each twelfth of the lookback (as aggregate.chart_buckets)."""
    from gpu_cost.aggregate import CHART_BUCKETS

    bucket = lookback / CHART_BUCKETS
    parts = []
    for k in range(CHART_BUCKETS):
        off = (CHART_BUCKETS - 1 - k) * bucket
        shift = f" offset {_dur(off)}" if off else ""
        parts.append(_stat(f"max_over_time(({d.util()})[{_dur(bucket - step / 2)}:{_dur(step)}]{shift})", f"chart_{k}"))
    return parts


def mem_trend(slope_h: np.ndarray, var_y: np.ndarray, var_t: np.ndarray, n: np.ndarray, t0: np.ndarray,
              t1: np.ndarray) -> dict[str, np.ndarray]:
    """Return the trend columns from the lookback query's parts (NaN where aggregate.mem_trend_stats has NaN)."""
    n = np.nan_to_num(n, nan=0.0)
    slope = np.where(n >= 2, slope_h, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = (slope / 3600.0) ** 2 * var_t / var_y
    ok = (n >= 3) & (var_y > 0) & (var_t > 0) & np.isfinite(r2)
    return {"mem_slope_mib_h_lb": slope, "mem_r2_lb": np.where(ok, np.clip(r2, 0.0, 1.0), np.nan),
            "mem_span_s_lb": np.where(n >= 1, t1 - t0, np.nan)}


def _node_norm(expr: str) -> str:
    e = f'label_replace({expr}, "host", "$1", "instance", "(.+?)(?::[0-9]+)?")'
    return f'label_replace({e}, "host", "$1", "node", "(.+)")'


def nodes_query(node_selector: str, window: float) -> str:
    """Per node: CPU busy %, memory available/total, worst filesystem free share, network and disk rates."""
    w = _dur(window)
    ns = node_selector
    fs = 'fstype!~"tmpfs|ramfs|overlay|squashfs|nsfs|autofs"'
    net = 'device!~"lo|veth.*|docker.*|br-.*"'
    idle = _sel("node_cpu_seconds_total", ns, extra='mode="idle"')
    avail = _sel("node_memory_MemAvailable_bytes", ns)
    total = _sel("node_memory_MemTotal_bytes", ns)
    fs_free = f"{_sel('node_filesystem_avail_bytes', ns, extra=fs)} / {_sel('node_filesystem_size_bytes', ns, extra=fs)}"
    rx = _sel("node_network_receive_bytes_total", ns, extra=net)
    tx = _sel("node_network_transmit_bytes_total", ns, extra=net)
    disk = 'device!~"loop.*|ram.*|dm-.*|md.*|sr.*"'
    rd = _sel("node_disk_read_bytes_total", ns, extra=disk)
    wr = _sel("node_disk_written_bytes_total", ns, extra=disk)
    return _union([
        _stat(f"100 * (1 - avg by (host) ({_node_norm(f'rate({idle}[{w}])')}))", "cpu_util"),
        _stat(f"max by (host) ({_node_norm(avail)})", "mem_available_bytes"),
        _stat(f"max by (host) ({_node_norm(total)})", "mem_total_bytes"),
        _stat(f"min by (host) ({_node_norm(fs_free)})", "disk_free_ratio"),
        _stat(f"sum by (host) ({_node_norm(f'rate({rx}[{w}])')})", "net_rx_bps"),
        _stat(f"sum by (host) ({_node_norm(f'rate({tx}[{w}])')})", "net_tx_bps"),
        _stat(f"sum by (host) ({_node_norm(f'rate({rd}[{w}])')})", "disk_read_bps"),
        _stat(f"sum by (host) ({_node_norm(f'rate({wr}[{w}])')})", "disk_write_bps"),
    ])


def freshness_query(selector: str) -> str:
    """The newest utilisation sample time over every GPU."""
    return f"max({Dialects(selector).newest()})"


# ---------------------------------------------------------------------------------------------
# reading


def short_model(model_name: str) -> str:
    """Return the cost key of a GPU model name: ``NVIDIA A100-SXM4-80GB`` → ``a100``, ``Tesla T4`` → ``t4``."""
    text = model_name.strip().lower()
    for prefix in ("nvidia ", "tesla ", "geforce ", "quadro "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    tokens = re.split(r"[\s\-_]+", text)
    if not tokens or not tokens[0]:
        return ""
    if tokens[0] == "rtx" and len(tokens) > 1:
        return "rtx" + tokens[1]
    return tokens[0]


def _value(sample: Mapping[str, Any]) -> float:
    try:
        v = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise SourceError(f"Prometheus answered a sample without a value: {str(sample)[:200]}") from None
    return v if math.isfinite(v) else math.nan


class PrometheusSource:
    """Read GPU and node aggregates from one Prometheus server.

    :param config: server and selectors (default: the ``gpu_cost_prometheus`` connection).
    :param client: a ready ``PrometheusConnect`` (tests, custom auth); built lazily otherwise.
    """

    def __init__(self, config: PromConfig | None = None, *, client: Any = None) -> None:
        self.config = config or prometheus_config()
        self._client = client
        self._count_lock = threading.Lock()
        self.queries_made = 0
        #: whether the last gpu_frame read the recording rules' series ("chunks", "samples") or raw ones ("")
        self.rules_used = ""
        #: per GPU key, labels the frame has no column for (pod, namespace, temperature)
        #: (a MIG slice: keyed with its GPU instance id as a fourth element)
        self.extras: dict[tuple[Any, ...], dict[str, Any]] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            from prometheus_api_client import PrometheusConnect
            from urllib3.util.retry import Retry

            # retry refused connections and 502/503/504 briefly; a slow answer is not retried (it
            # would only multiply the wait): it is reported as a timeout
            retry = Retry(total=2, connect=2, read=False, backoff_factor=0.2, status_forcelist=(502, 503, 504),
                          raise_on_status=False)
            self._client = PrometheusConnect(url=self.config.url, headers=dict(self.config.headers) or None,
                                             disable_ssl=not self.config.verify, auth=self.config.auth,
                                             timeout=self.config.timeout, retry=retry)
        return self._client

    def query(self, promql: str, at: float, what: str) -> list[dict[str, Any]]:
        """Run one instant query at ``at``; raise SourceError naming ``what`` on any failure."""
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        with self._count_lock:
            self.queries_made += 1
        where = redact(self.config.url)  # the URL may carry user:password@
        try:
            result = self.client.custom_query(promql, params={"time": f"{at:.3f}"}, timeout=self.config.timeout)
        except requests.exceptions.Timeout:
            raise SourceError(f"Prometheus at {where} did not answer the {what} query within "
                              f"{self.config.timeout:g}s") from None
        except requests.exceptions.RequestException as exc:
            if "timed out" in str(exc):
                raise SourceError(f"Prometheus at {where} did not answer the {what} query within "
                                  f"{self.config.timeout:g}s") from None
            raise SourceError(f"Prometheus at {where} cannot be reached ({what} query): "
                              f"{type(exc).__name__}: {redact(str(exc).split(' with url:')[0])[:200]}") from None
        except PrometheusApiClientException as exc:
            raise SourceError(f"Prometheus at {where} refused the {what} query: {redact(exc)[:300]}") from None
        except ValueError as exc:  # JSON decoding
            raise SourceError(f"Prometheus at {where} answered the {what} query with invalid JSON: {redact(exc)}") from None
        except (KeyError, TypeError, IndexError):  # JSON without data.result: not a Prometheus answer
            raise SourceError(f"Prometheus at {where} answered the {what} query without data.result") from None
        if not isinstance(result, list):
            raise SourceError(f"Prometheus at {where}: the {what} query did not return a vector")
        for s in result:
            metric = s.get("metric", {}) if isinstance(s, Mapping) else None
            if not isinstance(metric, Mapping) or not all(isinstance(v, str) for v in metric.values()):
                raise SourceError(f"Prometheus at {where}: the {what} query returned a malformed sample: "
                                  f"{str(s)[:200]}")
        return result

    # -- GPUs ------------------------------------------------------------------------------
    def gpu_frame(self, policy: Any, now: float) -> tuple[Any, dict[float, Any]]:
        """Return ``(gpus, windows)``: the :data:`~gpu_cost.model.GPU_COLUMNS` frame and extra windows."""
        import pandas as pd

        from gpu_cost.aggregate import CHART_BUCKETS, chart_text, with_mig
        from gpu_cost.model import GPU_COLUMNS, empty_gpu_frame
        from gpu_cost.snapshot import rule_windows

        sw = policy.sweep
        step = float(sw.sample_interval)
        at = math.floor(now / step) * step
        primary, others = rule_windows(policy)
        windows = [primary, *others]
        # the newest sample is judged at ``now`` itself; aggregates on the sample grid ending at ``at``
        rules_lb = sw.lookback if self.config.recording_rules else None
        cur = self.query(current_query(self.config.selector, rules_lb), now, "current")
        rec = self._rules_plan(cur, policy, at, now) if rules_lb else None
        self.rules_used = rec.mode if rec else ""
        if rec:
            from gpu_cost.sources import recording

            # as of the rules' last evaluation (within a step after ``at``): the same grid samples
            asks = [(recording.windows_query_recorded(windows, primary, rec.chunk, rec.at), rec.at, "windows"),
                    (recording.lookback_query_recorded(sw.lookback, step, rec.chunk, rec.at), rec.at, "lookback")]
        else:
            asks = [(windows_query(self.config.selector, windows, primary, step), at, "windows"),
                    (lookback_query(self.config.selector, sw.lookback, step, sw.busy_util), at, "lookback")]
        win, lb = self._together(asks)

        rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        info: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        uuid_gpu: dict[tuple[str, str], str] = {}

        def key_of(m: Mapping[str, str]) -> tuple[str, str, str, str]:
            return (m.get("host", ""), m.get("gpu", ""), m.get("UUID", ""), m.get("GPU_I_ID", ""))

        for s in cur:
            m = s.get("metric", {})
            stat = m.get("stat", "")
            if stat in ("rules", "rules_since"):
                continue
            k = key_of(m)
            v = _value(s)
            if stat == "index":
                if not math.isnan(v):
                    uuid_gpu[(k[0], k[2])] = str(int(v))
                continue
            if stat == "info":
                info.setdefault(k, {})["model_name"] = m.get("name", "")
                continue
            row = rows.setdefault(k, {})
            if stat == "last_ts":
                # two series for one GPU (a job label changing right now): keep the newest, labelled one
                prev = row.get("last_ts", -math.inf)
                if v > prev or (v == prev and m.get("hpc_job")):
                    row["last_ts"] = v
                    for label in INFO_LABELS:
                        row[label] = m.get(label, "")
            elif stat in ("mem_total", "temp"):
                row[stat] = v
        for sample_set in (win, lb):
            for s in sample_set:
                m = s.get("metric", {})
                rows.setdefault(key_of(m), {})[m.get("stat", "")] = _value(s)
        if not rows:
            return empty_gpu_frame(), {w: _window_frame(pd, [], w, step, sw) for w in others}
        if rec and rec.chunk:
            from gpu_cost.sources import recording

            for row in rows.values():
                recording.finish(row)

        # a GPU whose slices report is seen through them: a series of the whole GPU beside them
        # (device-level fields without GPU_I_ID) is not a device of its own
        sliced = {(h, g, u) for (h, g, u, gi) in rows if gi}
        rows = {k: v for k, v in rows.items() if k[3] or (k[0], k[1], k[2]) not in sliced}
        # nvidia_gpu_exporter has no index label: take it from nvidia_smi_index
        merged: dict[tuple[str, int, str, str], dict[str, Any]] = {}
        for (host, gpu, uuid, gi_id), row in rows.items():
            idx = gpu or uuid_gpu.get((host, uuid), "")
            try:
                gi = int(idx)
            except ValueError:
                logger.warning("GPU %s on %s has no index label: skipped", uuid or "?", host or "?")
                continue
            if not 0 <= gi < 1 << 16:
                logger.warning("GPU %s on %s has an impossible index %r: skipped", uuid or "?", host or "?", idx)
                continue
            model = row.get("modelName") or info.get((host, gpu, uuid, ""), {}).get("model_name", "")
            target = merged.setdefault((host, gi, uuid, gi_id), {})
            for k2, v2 in row.items():
                if k2 not in target or (isinstance(v2, float) and not math.isnan(v2)):
                    target[k2] = v2
            target["model"] = short_model(model) if model else target.get("model", "")
        keys = sorted(merged, key=lambda k: (k[0], k[1], k[2], int(k[3]) if k[3].isdigit() else -1, k[3]))
        recs = [merged[k] for k in keys]
        expected = max(1, round(primary / step))

        def col(name: str, default: float = math.nan) -> np.ndarray:
            return np.array([float(r.get(name, default)) for r in recs], dtype=float)

        last_ts = col("last_ts")
        n = np.nan_to_num(col(f"n@{primary:g}", 0.0)).astype(np.int64)
        stale = (n < sw.min_sample_ratio * expected) | ~(now - np.nan_to_num(last_ts, nan=-np.inf) <= sw.max_staleness)
        frame = pd.DataFrame({
            "host": pd.Series([k[0] for k in keys], dtype=object),
            "gpu": np.array([k[1] for k in keys], dtype=np.int64),
            "uuid": pd.Series([k[2] for k in keys], dtype=object),
            "model": pd.Series([r.get("model", "") for r in recs], dtype=object),
            "label_job_id": pd.Series([str(r.get("hpc_job", "") or "") for r in recs], dtype=object),
            "util_mean": col(f"util_mean@{primary:g}"),
            "util_max": col(f"util_max@{primary:g}"),
            "mem_min_mib": col(f"mem_min@{primary:g}"),
            "mem_max_mib": col(f"mem_max@{primary:g}"),
            "mem_total_mib": col("mem_total"),
            "power_w": col(f"power@{primary:g}"),
            "n_samples": n,
            "expected_samples": np.full(len(keys), expected, dtype=np.int64),
            "last_ts": last_ts,
            "util_mean_lb": col("util_mean_lb"),
            "util_max_lb": col("util_max_lb"),
            "busy_share_lb": col("busy_share_lb"),
            "bursts_lb": np.nan_to_num(col("bursts_lb", 0.0)).astype(np.int64),
            "n_lb": np.nan_to_num(col("n_lb", 0.0)).astype(np.int64),
            **mem_trend(col("mem_slope_lb"), col("mem_var_lb"), col("mem_tvar_lb"), col("mem_n_lb", 0.0),
                        col("mem_t0_lb"), col("mem_t1_lb")),
            "stale": stale.astype(bool),
            "util_chart_lb": chart_text(np.stack([col(f"chart_{k}") for k in range(CHART_BUCKETS)], axis=1)),
        })[list(GPU_COLUMNS)]
        if any(k[3] for k in keys):
            frame = with_mig(frame, mig_columns(keys, recs))
        self.extras = {}
        for dk, r in zip(keys, recs, strict=True):
            ek: tuple[Any, ...] = dk if dk[3] else dk[:3]
            self.extras[ek] = {"pod": r.get("pod", ""), "namespace": r.get("namespace", ""),
                               "temp_c": r.get("temp", math.nan)}
        extra = {w: _window_frame(pd, recs, w, step, sw, last_ts, now) for w in others}
        return frame, extra

    def _together(self, asks: Sequence[tuple[str, float, str]]) -> list[list[dict[str, Any]]]:
        """Run independent queries at the same time; return their answers in order (the first error is raised)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(asks), thread_name_prefix="gpu-cost-promql") as pool:
            futures = [pool.submit(self.query, promql, at, what) for promql, at, what in asks]
            return [f.result() for f in futures]

    def _rules_plan(self, cur: list[dict[str, Any]], policy: Any, at: float, now: float) -> Any:
        """Return how to read the recording rules' series (:class:`~gpu_cost.sources.recording.Plan`), or None."""
        from gpu_cost.sources import recording

        sw = policy.sweep
        rec = recording.plan(cur, step=float(sw.sample_interval), busy=float(sw.busy_util), lookback=float(sw.lookback),
                             selector=self.config.selector, at=at, now=now)
        if rec is None and any(s.get("metric", {}).get("stat") == "rules" for s in cur):
            logger.info("recording rules on %s do not fit this policy, are younger than its lookback or lag: raw queries",
                        redact(self.config.url))
        return rec

    # -- nodes -----------------------------------------------------------------------------
    def node_stats(self, policy: Any, now: float) -> dict[str, dict[str, float]]:
        """Return per node: ``cpu_util`` %, ``mem_available_bytes``, ``mem_total_bytes``,
        ``disk_free_ratio``, ``net_rx_bps``, ``net_tx_bps``, ``disk_read_bps``, ``disk_write_bps`` (node_exporter)."""
        window = max(policy.rules.zombie.window, 4 * policy.sweep.sample_interval)
        out: dict[str, dict[str, float]] = {}
        for s in self.query(nodes_query(self.config.node_selector, window), now, "nodes"):
            m = s.get("metric", {})
            host = m.get("host", "")
            if host:
                out.setdefault(host, {})[m.get("stat", "")] = _value(s)
        return out

    # -- freshness -------------------------------------------------------------------------
    def newest_sample_ts(self, now: float) -> float | None:
        """Return the newest GPU utilisation sample time (None when there is none within 5 minutes)."""
        result = self.query(freshness_query(self.config.selector), now, "freshness")
        if not result:
            return None
        v = _value(result[0])
        return None if math.isnan(v) else v


def _parent_gb(model_name: str) -> float | None:
    """Return the framebuffer (GB) a model name states (``NVIDIA A100-SXM4-80GB`` → 80), or None."""
    m = re.search(r"(\d+)\s*GB", model_name, re.IGNORECASE)
    return float(m.group(1)) if m else None


def mig_columns(keys: list[tuple[str, int, str, str]], recs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Return the MIG columns for the frame's rows (``GPU_I_ID``, ``GPU_I_PROFILE``, the share it costs)."""
    from gpu_cost.model import mig_share

    migs, profiles, shares = [], [], []
    for k, r in zip(keys, recs, strict=True):
        profile = str(r.get("GPU_I_PROFILE", "") or "") if k[3] else ""
        share = 1.0
        if k[3]:
            try:
                share = mig_share(profile, _parent_gb(str(r.get("modelName", ""))))
            except ValueError:
                # an unknown profile name: cost it as the whole GPU rather than guess it smaller
                logger.warning("MIG slice %s of GPU %s on %s has profile %r: costed as a whole GPU", k[3], k[1], k[0],
                               profile)
        migs.append(k[3])
        profiles.append(profile)
        shares.append(share)
    return {"mig": np.array(migs, dtype=object), "mig_profile": np.array(profiles, dtype=object),
            "mig_uuid": np.array([""] * len(keys), dtype=object), "share": np.array(shares, dtype=float)}


def _window_frame(pd: Any, recs: list[dict[str, Any]], w: float, step: float, sw: Any,
                  last_ts: np.ndarray | None = None, at: float = 0.0) -> Any:
    """Return the window columns for another window length (as aggregate.extra_window)."""
    tag = f"{w:g}"
    expected = max(1, round(w / step))
    n = np.array([int(np.nan_to_num(r.get(f"n@{tag}", 0.0))) for r in recs], dtype=np.int64)
    lt = last_ts if last_ts is not None else np.full(len(recs), np.nan)

    def col(name: str) -> np.ndarray:
        return np.array([float(r.get(f"{name}@{tag}", math.nan)) for r in recs], dtype=float)

    return pd.DataFrame({
        "util_mean": col("util_mean"), "util_max": col("util_max"), "mem_min_mib": col("mem_min"),
        "mem_max_mib": col("mem_max"), "power_w": np.full(len(recs), np.nan), "n_samples": n,
        "expected_samples": np.full(len(recs), expected, dtype=np.int64), "last_ts": lt,
        "stale": (n < sw.min_sample_ratio * expected) | ~(at - np.nan_to_num(lt, nan=-np.inf) <= sw.max_staleness),
    })
