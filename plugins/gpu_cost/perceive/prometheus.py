"""GPU and node metrics from Prometheus: DCGM (dcgm-exporter), nvidia_gpu_exporter, node_exporter.

Every aggregate is computed *in PromQL*, so a sweep costs a constant number of queries whatever
the cluster size (:attr:`PrometheusSource.queries_made` counts them):

1. ``current``   — per GPU: newest sample time, identity labels (``Hostname``/``instance``, ``gpu``,
   ``UUID``, ``modelName``, ``hpc_job``, ``pod``, ``namespace``), framebuffer size, temperature;
2. ``windows``   — per GPU and rule window: mean/max utilisation, min/max framebuffer used, sample
   count, mean power;
3. ``lookback``  — per GPU over the lookback: mean/max utilisation, busy share, idle→busy bursts,
   sample count, and the framebuffer's trend (``deriv`` slope, R², span: a leak grows steadily);
4. ``chart``     — per GPU the max utilisation of each twelfth of the lookback (the notices' chart);
5. ``nodes``     — per node from node_exporter: CPU busy %, memory available, disk, network.

Where the recording rules of :mod:`gpu_cost.perceive.recording` (shipped in
``deploy/prometheus/gpu-cost.rules.yml``) run on the server and fit the policy, ``windows`` and
``lookback`` read their series instead of the raw ones: same answers, a fraction of the samples.
A first small query, ``rules`` (two series), says whether they do (:attr:`PrometheusSource.rules_used`)
and as of when to read them; ``current``, ``windows``, ``lookback`` and ``chart`` do not depend on
each other and are sent at the same time after it (Prometheus evaluates each query on a core of
its own: the lookback and its chart are two queries so that neither waits for the other). With
the rules' 30-minute chunks, the lookback, its chart and the windows of whole chunks come instead
from one range query per chunk series, added up in numpy (:func:`~gpu_cost.perceive.recording.chunk_columns`).

One :class:`Connection` per source talks to the server: ``prometheus_api_client.PrometheusConnect``
holds the URL, the auth, the headers, TLS and the retries, and asks the small queries (``rules``,
``nodes``, the freshness sensor's): their answers, a handful of series, are decoded by it and
checked here. The large answers (``current``, ``windows``, ``lookback``, ``chart`` and the chunk
reads: tens of series per GPU) are POSTed on the same session and decoded and checked in one
pass by ``msgspec`` into :class:`Sample` objects, several times faster than the library's
``json`` at thousands of GPUs (``python -m bench.prometheus``: the figures are in docs/benchmarks.md).

Series are resampled on the policy's ``sample_interval`` grid with subqueries
(``avg_over_time(U[15m:60s])``), which gives exactly the samples :mod:`gpu_cost.perceive.aggregate` sees
for the simulator and traces, so ``stale`` and ``bursts_lb`` mean the same thing for every
source. Utilisation prefers ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a 0-1 ratio, scaled to %), falls
back to ``DCGM_FI_DEV_GPU_UTIL`` and then to nvidia_gpu_exporter's
``nvidia_smi_utilization_gpu_ratio``. Values outside 0-100 % are dropped, never read as idle;
framebuffer readings below 0 or above ``aggregate.MAX_MEM_MIB`` are dropped, never read as held.

The server comes from the Airflow connection ``gpu_cost_prometheus`` (``AIRFLOW_CONN_GPU_COST_PROMETHEUS``
as a URI or JSON, or Airflow's own lookup), else ``GPU_COST_PROMETHEUS_URL``. Connection extras:
``selector`` (label matchers added to every GPU selector, e.g. ``job="dcgm"``), ``node_selector``
(the same for node_exporter), ``timeout`` (seconds), ``verify`` (TLS: ``false``, or the path of a CA
bundle to check the server's certificate against), ``headers``,
``recording_rules`` (``false``: never read the recording rules' series). A server that
cannot be reached, times out or answers nonsense raises :class:`~gpu_cost.core.errors.SourceError`;
a GPU missing from some answers is *stale*, never idle. Errors name the server with its
credentials redacted (:func:`gpu_cost.core.redact.redact`).
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

import msgspec
import numpy as np

from gpu_cost.core import connections
from gpu_cost.core.errors import SourceError
from gpu_cost.core.redact import redact
from gpu_cost.perceive.promql import (
    INFO_LABELS,
    KEY_LABELS,
    Dialects,
    _by,
    _dur,
    _sel,
    _stat,
    _union,
    chart_buckets_query,
)

logger = logging.getLogger(__name__)

CONN_ID = "gpu_cost_prometheus"
URL_ENV = "GPU_COST_PROMETHEUS_URL"

# ---------------------------------------------------------------------------------------------
# connection


@dataclass(frozen=True, repr=False)
class PromConfig:
    """Where Prometheus is and how to read it.

    :param selector: label matchers (without braces) added to every GPU metric selector.
    :param node_selector: the same for node_exporter metrics.
    :param recording_rules: read :mod:`gpu_cost.perceive.recording`'s series where they fit (False: raw only).
    """

    url: str
    selector: str = ""
    node_selector: str = ""
    timeout: float = 15.0
    #: check the server's TLS certificate (True), not (False), or against this CA bundle (a path)
    verify: bool | str = True
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
    verify = _verify(extra.get("verify", True), conn_id)
    rules = str(extra.get("recording_rules", "true")).lower() not in ("false", "0", "no")
    headers = extra.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise SourceError(f"connection {conn_id}: extra.headers must be a mapping")
    auth = (str(conn["login"]), str(conn.get("password") or "")) if conn.get("login") else None
    return PromConfig(url=url, selector=selector, node_selector=node_selector, timeout=timeout, verify=verify,
                      headers={str(k): str(v) for k, v in headers.items()}, auth=auth, recording_rules=rules)


def _verify(value: Any, conn_id: str) -> bool | str:
    """The ``verify`` extra: a boolean (``false``/``0``/``no`` turn the check off) or a CA bundle's path."""
    text = str(value).strip()
    if isinstance(value, bool) or text.lower() in ("true", "1", "yes", "false", "0", "no"):
        return text.lower() in ("true", "1", "yes")
    if not os.path.isfile(text):
        raise SourceError(f"connection {conn_id}: extra.verify is neither true/false nor a CA bundle file: {text!r}")
    return text


# ---------------------------------------------------------------------------------------------
# PromQL


def current_query(selector: str) -> str:
    """Newest sample time with identity labels, framebuffer size, temperature, nvidia-smi index/name."""
    d = Dialects(selector)
    return _union([
        _stat(d.newest((*KEY_LABELS, *INFO_LABELS)), "last_ts"),
        _stat(d.mem_total(), "mem_total"),
        _stat(d.temperature(), "temp"),
        _stat(_by(d.s("nvidia_smi_index")), "index"),
        _stat(_by(d.s("nvidia_smi_gpu_info"), (*KEY_LABELS, "name")), "info"),
    ])


def rules_query(lookback: float) -> str:
    """The recording rules' info series now (``stat="rules"``, valued at their last evaluation time) and
    one lookback ago (``stat="rules_since"``): whether :mod:`gpu_cost.perceive.recording`'s series can
    stand in for the raw ones, and as of when to read them."""
    from gpu_cost.perceive.recording import INFO

    return _union([_stat(f"timestamp({INFO})", "rules"), _stat(f"{INFO} offset {_dur(lookback)}", "rules_since")])


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
    ])


def chart_query(selector: str, lookback: float, step: float) -> str:
    """The notices' utilisation chart: the max of each twelfth of the lookback (as aggregate.chart_buckets).

    A query of its own, sent with the lookback's: Prometheus evaluates the two on two cores.
    """
    util = Dialects(selector).util()
    return chart_buckets_query(lookback, lambda bucket, shift: (
        f"max_over_time(({util})[{_dur(bucket - step / 2)}:{_dur(step)}]{shift})"))


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


class Sample(msgspec.Struct, frozen=True, gc=False):
    """One series of an instant query's answer: its labels and its ``[time, "value"]``."""

    value: tuple[float, str]
    metric: dict[str, str] = msgspec.field(default_factory=dict)


class Key(msgspec.Struct, frozen=True, gc=False):
    """The labels of an aggregate's series that the source reads (the others are skipped while decoding)."""

    host: str = ""
    gpu: str = ""
    UUID: str = ""
    GPU_I_ID: str = ""
    stat: str = ""


class KeyedSample(msgspec.Struct, frozen=True, gc=False):
    """A sample of the ``windows`` and ``lookback`` answers: a device key, a stat and the value."""

    value: tuple[float, str]
    metric: Key = msgspec.field(default_factory=Key)


class Point(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One ``[time, "value"]`` of a range query's series."""

    t: float
    v: str


class RangeSample(msgspec.Struct, frozen=True, gc=False):
    """A series of a range query's answer: a device key and its values."""

    values: list[Point]
    metric: Key = msgspec.field(default_factory=Key)


class _Data(msgspec.Struct, gc=False):
    result: list[Sample]


class _Answer(msgspec.Struct, gc=False):
    data: _Data


class _KeyedData(msgspec.Struct, gc=False):
    result: list[KeyedSample]


class _KeyedAnswer(msgspec.Struct, gc=False):
    data: _KeyedData


class _RangeData(msgspec.Struct, gc=False):
    result: list[RangeSample]


class _RangeAnswer(msgspec.Struct, gc=False):
    data: _RangeData


#: a query's answer, checked while it is decoded (a label that is not text, a sample without its
#: value pair, a scalar or matrix where a vector belongs: a ValidationError naming where)
_ANSWER = msgspec.json.Decoder(_Answer)
_KEYED = msgspec.json.Decoder(_KeyedAnswer)
_RANGE = msgspec.json.Decoder(_RangeAnswer)


#: the instant queries whose answers are tens of series per GPU: decoded by msgspec, not by
#: PrometheusConnect's ``json`` (range queries, the chunk reads, are too); ``python -m bench.prometheus``
#: times both decoders on each of a sweep's answers (docs/benchmarks.md)
LARGE_ANSWERS = frozenset({"current", "windows", "lookback", "chart"})

#: queries a sweep sends at once at most (Prometheus evaluates each on a core of its own)
PARALLEL_QUERIES = 8


class PromHttpError(Exception):
    """Prometheus answered a query with an HTTP error status."""


def _refusal(status: int | str, content: bytes) -> PromHttpError:
    """The error for an answer with an HTTP error status: Prometheus's own ``errorType: error`` where it gave one."""
    why = content[:300].decode("utf-8", "replace")
    try:  # Prometheus's own error answer: {"status": "error", "errorType": …, "error": …}
        doc = msgspec.json.decode(content)
        why = f"{doc.get('errorType', '')}: {doc['error']}" if isinstance(doc, dict) and doc.get("error") else why
    except (msgspec.DecodeError, TypeError):
        pass
    return PromHttpError(f"HTTP {status}: {why}")


#: ``PrometheusApiClientException``'s text: ``HTTP Status Code 400 (b'{"status":"error",…}')``
_LIBRARY_REFUSAL = re.compile(r"HTTP Status Code (\d+) \((b(['\"]).*\3)\)", re.DOTALL)


def _library_refusal(exc: Exception) -> PromHttpError:
    """The library's error for a status other than 200, as :func:`_refusal` words it."""
    import ast

    m = _LIBRARY_REFUSAL.fullmatch(str(exc))
    if m is None:
        return PromHttpError(str(exc)[:300])
    return _refusal(m.group(1), ast.literal_eval(m.group(2)))


class Connection:
    """The one connection to a Prometheus server, built from its :class:`PromConfig`.

    ``api`` is a ``prometheus_api_client.PrometheusConnect``: the URL, basic auth, headers (a bearer
    token), TLS verification or a CA bundle, and the retries (a refused connection or a 502/503/504
    retried briefly; a slow answer is not: it would only multiply the wait, and is reported as a
    timeout). It asks the small queries (:meth:`ask`). :meth:`post` sends a large query on the same
    session, its PromQL (kilobytes) as a POSTed form, and returns the body for ``msgspec`` to decode.
    """

    def __init__(self, config: PromConfig) -> None:
        import requests
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = config.url.rstrip("/")
        session = requests.Session()
        session.verify = config.verify  # PrometheusConnect takes a boolean only: a CA bundle comes on the session
        retry = Retry(total=2, connect=2, read=False, backoff_factor=0.2, status_forcelist=(502, 503, 504),
                      allowed_methods=frozenset({"GET", "POST"}), raise_on_status=False)  # a query changes nothing
        # its adapter's pool (10 connections) holds the queries a sweep sends at once (PARALLEL_QUERIES)
        self.api = PrometheusConnect(url=self.url, headers=dict(config.headers) or None, auth=config.auth, retry=retry,
                                     session=session, method="POST")
        self.session = session

    def ask(self, promql: str, at: float, timeout: float) -> list[Sample]:
        """Return the answer of a small instant query at ``at``, as PrometheusConnect decoded it, checked.

        Raises requests' errors (unreachable, timeout), :class:`PromHttpError`, ``msgspec.DecodeError``
        (no JSON) or ``msgspec.ValidationError`` (JSON, but no vector of samples).
        """
        import requests
        from prometheus_api_client import PrometheusApiClientException

        try:
            result = self.api.custom_query(promql, params={"time": f"{at:.3f}"}, timeout=timeout)
        except PrometheusApiClientException as exc:
            raise _library_refusal(exc) from None
        except requests.exceptions.JSONDecodeError as exc:
            raise msgspec.DecodeError(str(exc)) from None
        except (KeyError, TypeError) as exc:  # JSON without data.result
            raise msgspec.ValidationError(f"no data.result in the answer ({type(exc).__name__}: {exc})") from None
        return msgspec.convert(result, list[Sample])

    def post(self, path: str, form: Mapping[str, str], timeout: float) -> bytes:
        """Return the body of the API endpoint ``path`` (``/api/v1/query``, ``/api/v1/query_range``) asked
        ``form`` on the connection's session; raise PromHttpError on a status other than 200."""
        # verify named on each request, as PrometheusConnect does: left to the session, requests would let
        # REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE override the connection's CA bundle or its verify=false
        r = self.session.post(f"{self.url}{path}", data=dict(form), headers=self.api.headers, auth=self.api.auth,
                              verify=self.session.verify, timeout=timeout)
        if r.status_code != 200:
            raise _refusal(r.status_code, r.content)
        return r.content


def _bad_answer(exc: Exception, where: str, what: str, shape: str) -> SourceError:
    """The error for an answer that is no JSON, or JSON but not the ``shape`` of samples asked for."""
    if isinstance(exc, msgspec.ValidationError):
        return SourceError(f"Prometheus at {where} answered the {what} query with no {shape} of samples: "
                           f"{redact(exc)[:200]}")
    return SourceError(f"Prometheus at {where} answered the {what} query with invalid JSON: {redact(exc)}")


def _value(sample: Sample) -> float:
    """The sample's value, NaN where Prometheus wrote ``NaN`` or ``±Inf``."""
    try:
        v = float(sample.value[1])
    except ValueError:
        raise SourceError(f"Prometheus answered a sample without a value: {str(sample)[:200]}") from None
    return v if math.isfinite(v) else math.nan


def _floats(texts: Sequence[float | str], what: str) -> np.ndarray:
    """Values as numbers, in one conversion (``NaN``, ``+Inf`` as Prometheus writes them); one that is no
    number is a SourceError naming it."""
    try:
        return np.asarray(texts, dtype=float)
    except ValueError:
        bad = next((t for t in texts if not _is_number(t)), "?")
        raise SourceError(f"Prometheus answered a {what} value that is no number: {str(bad)[:50]!r}") from None


def _is_number(text: float | str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class PrometheusSource:
    """Read GPU and node aggregates from one Prometheus server.

    :param config: server and selectors (default: the ``gpu_cost_prometheus`` connection).
    :param client: a ready :class:`Connection` (or an object with its ``ask`` and ``post``); built lazily otherwise.
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
            self._client = Connection(self.config)
        return self._client

    def query(self, promql: str, at: float, what: str, keyed: bool = False) -> Any:
        """Run one instant query at ``at``; raise SourceError naming ``what`` on any failure.

        The queries of :data:`LARGE_ANSWERS` (and ``keyed`` ones) are decoded by ``msgspec``; the others are
        asked through ``PrometheusConnect``.

        :param keyed: return :class:`KeyedSample` objects (the device key and ``stat`` only), not :class:`Sample`.
        """
        if keyed or what in LARGE_ANSWERS:
            return self._ask("/api/v1/query", {"query": promql, "time": f"{at:.3f}"}, what, _KEYED if keyed else _ANSWER)
        return self._ask("/api/v1/query", {"query": promql, "time": f"{at:.3f}"}, what, None)

    def query_range(self, promql: str, span: tuple[str, str, str], what: str) -> list[RangeSample]:
        """Run one range query over ``span`` (``start``, ``end``, ``step``, in seconds as text)."""
        start, end, step = span
        return self._ask("/api/v1/query_range", {"query": promql, "start": start, "end": end, "step": step}, what,
                         _RANGE)

    def _ask(self, path: str, form: Mapping[str, str], what: str, decoder: Any) -> Any:
        """Ask ``form`` of ``path``: through PrometheusConnect (``decoder`` None: a small instant query) or POSTed
        and decoded by ``decoder``; every failure a SourceError naming the server (redacted) and ``what``."""
        import requests

        with self._count_lock:
            self.queries_made += 1
        where = redact(self.config.url)  # the URL may carry user:password@
        try:
            if decoder is None:  # a small answer: PrometheusConnect's
                return self.client.ask(form["query"], float(form["time"]), self.config.timeout)
            body = self.client.post(path, form, self.config.timeout)
        except requests.exceptions.Timeout:
            raise SourceError(f"Prometheus at {where} did not answer the {what} query within "
                              f"{self.config.timeout:g}s") from None
        except requests.exceptions.RequestException as exc:
            if "timed out" in str(exc):
                raise SourceError(f"Prometheus at {where} did not answer the {what} query within "
                                  f"{self.config.timeout:g}s") from None
            raise SourceError(f"Prometheus at {where} cannot be reached ({what} query): "
                              f"{type(exc).__name__}: {redact(str(exc).split(' with url:')[0])[:200]}") from None
        except PromHttpError as exc:
            raise SourceError(f"Prometheus at {where} refused the {what} query: {redact(exc)[:300]}") from None
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:  # a small answer, checked
            raise _bad_answer(exc, where, what, "vector") from None
        try:
            return decoder.decode(body).data.result
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise _bad_answer(exc, where, what, "matrix" if decoder is _RANGE else "vector") from None

    # -- GPUs ------------------------------------------------------------------------------
    def gpu_frame(self, policy: Any, now: float) -> tuple[Any, dict[float, Any]]:
        """Return ``(gpus, windows)``: the :data:`~gpu_cost.core.model.GPU_COLUMNS` frame and extra windows."""
        import pandas as pd

        from gpu_cost.core.model import GPU_COLUMNS, empty_gpu_frame
        from gpu_cost.perceive.aggregate import CHART_BUCKETS, chart_text, with_mig
        from gpu_cost.perceive.snapshot import rule_windows

        sw = policy.sweep
        step = float(sw.sample_interval)
        at = math.floor(now / step) * step
        primary, others = rule_windows(policy)
        windows = [primary, *others]
        # the newest sample is judged at ``now`` itself; aggregates on the sample grid ending at ``at``
        rec = None
        if self.config.recording_rules:  # a few series: whether the rules fit, and as of when to read them
            rec = self._rules_plan(self.query(rules_query(sw.lookback), now, "rules"), policy, at, now)
        self.rules_used = rec.mode if rec else ""
        calls: list[Any] = [lambda: self.query(current_query(self.config.selector), now, "current")]
        reads: tuple[tuple[str, str], ...] = ()
        if rec and rec.chunk:
            from gpu_cost.perceive import recording

            # as of the rules' last evaluation (within a step after ``at``): the same grid samples; each
            # per-chunk series in a range query of its own (its values a chunk apart), added up here
            n_chunks = recording.chunk_steps(sw.lookback, others, primary, rec.chunk)
            span = recording.chunk_range(rec.at, rec.chunk, n_chunks)
            reads = recording.CHUNK_READS
            calls.append(lambda: self.query(recording.windows_query_recorded(windows, primary, rec.chunk, sw.lookback, step),
                                            rec.at, "windows", keyed=True))
            calls += [lambda r=r: self.query_range(recording.chunk_read(r[0], r[1], rec.chunk), span, f"{r[0]}:{r[1]} chunks")
                      for r in reads]
        elif rec:
            from gpu_cost.perceive import recording

            calls += [lambda: self.query(recording.windows_query_recorded(windows, primary), rec.at, "windows", keyed=True),
                      lambda: self.query(recording.lookback_query_samples(sw.lookback, step), rec.at, "lookback", keyed=True),
                      lambda: self.query(recording.chart_query_samples(sw.lookback), rec.at, "chart", keyed=True)]
        else:
            sel = self.config.selector
            calls += [lambda: self.query(windows_query(sel, windows, primary, step), at, "windows", keyed=True),
                      lambda: self.query(lookback_query(sel, sw.lookback, step, sw.busy_util), at, "lookback", keyed=True),
                      lambda: self.query(chart_query(sel, sw.lookback, step), at, "chart", keyed=True)]
        answers = self._together(calls)
        cur, keyed, ranged = answers[0], answers[1:len(answers) - len(reads)], answers[len(answers) - len(reads):]

        # one raw row per series key, in the order first seen; numbers gathered per stat, then as arrays
        index: dict[tuple[str, str, str, str], int] = {}
        labels: dict[int, dict[str, Any]] = {}  # a raw row's INFO_LABELS, from its newest last_ts series
        newest: dict[int, float] = {}
        info: dict[tuple[str, str, str, str], str] = {}
        uuid_gpu: dict[tuple[str, str], str] = {}
        gathered: dict[str, tuple[list[int], list[float | str]]] = {}  # values: numbers, or text as answered

        def row_of(k: tuple[str, str, str, str]) -> int:
            i = index.get(k)
            if i is None:
                i = index[k] = len(index)
            return i

        for s in cur:
            m = s.metric
            stat = m.get("stat", "")
            k = (m.get("host", ""), m.get("gpu", ""), m.get("UUID", ""), m.get("GPU_I_ID", ""))
            v = _value(s)
            if stat == "index":
                if not math.isnan(v):
                    uuid_gpu[(k[0], k[2])] = str(int(v))
                continue
            if stat == "info":
                info[k] = m.get("name", "")
                continue
            i = row_of(k)
            if stat == "last_ts":
                # two series for one GPU (a job label changing right now): keep the newest, labelled one
                prev = newest.get(i, -math.inf)
                if v > prev or (v == prev and m.get("hpc_job")):
                    newest[i] = v
                    labels[i] = {label: m.get(label, "") for label in INFO_LABELS}
            elif stat in ("mem_total", "temp"):
                got = gathered.setdefault(stat, ([], []))
                got[0].append(i)
                got[1].append(v)
        for sample_set in keyed:
            for s in sample_set:
                m = s.metric
                got = gathered.setdefault(m.stat, ([], []))
                got[0].append(row_of((m.host, m.gpu, m.UUID, m.GPU_I_ID)))
                got[1].append(s.value[1])
        points: list[tuple[list[int], list[float], list[str]]] = []
        for series in ranged:
            rows_at: list[int] = []
            times: list[float] = []
            texts: list[str] = []
            for rs in series:
                m = rs.metric
                i = row_of((m.host, m.gpu, m.UUID, m.GPU_I_ID))
                for pt in rs.values:
                    rows_at.append(i)
                    times.append(pt.t)
                    texts.append(pt.v)
            points.append((rows_at, times, texts))
        if not index:
            return empty_gpu_frame(), {w: _window_frame(pd, lambda _: np.zeros(0), 0, w, step, sw) for w in others}
        n_raw = len(index)
        raw: dict[str, np.ndarray] = {}
        for stat, (rows_of, values) in gathered.items():
            arr = raw[stat] = np.full(n_raw, np.nan)
            vals = _floats(values, f"{stat!r}")
            arr[np.asarray(rows_of, dtype=np.int64)] = np.where(np.isfinite(vals), vals, np.nan)  # the last one wins
        arr = raw["last_ts"] = np.full(n_raw, np.nan)
        arr[list(newest)] = list(newest.values())
        if rec and rec.chunk:
            from gpu_cost.perceive import recording

            mats: dict[tuple[str, str], np.ndarray] = {}
            for r, (rows_at, times, texts) in zip(reads, points, strict=True):
                mat = mats[r] = np.full((n_raw, n_chunks), np.nan)
                vals = _floats(texts, f"{r[0]}:{r[1]} chunks")
                j = np.rint((rec.at - np.asarray(times, dtype=float)) / rec.chunk).astype(np.int64)
                ok = (j >= 0) & (j < n_chunks)
                mat[np.asarray(rows_at, dtype=np.int64)[ok], j[ok]] = np.where(np.isfinite(vals), vals, np.nan)[ok]
            raw.update(recording.chunk_columns(mats, n_raw, chunk=rec.chunk, lookback=sw.lookback, windows=others,
                                               primary=primary, burst_edge=raw.get("burst_edge")))
            recording.finish(raw, n_raw)

        # a GPU whose slices report is seen through them: a series of the whole GPU beside them
        # (device-level fields without GPU_I_ID) is not a device of its own
        sliced = {(h, g, u) for (h, g, u, gi) in index if gi}
        # nvidia_gpu_exporter has no index label: take it from nvidia_smi_index; raw rows that come
        # to the same device are merged (a number: the last one given; a label: the first)
        target: dict[tuple[str, int, str, str], int] = {}
        sources: list[int] = []
        targets: list[int] = []
        tlabels: list[dict[str, Any]] = []
        models: list[str] = []
        for (host, gpu, uuid, gi_id), i in index.items():
            if not gi_id and (host, gpu, uuid) in sliced:
                continue
            idx = gpu or uuid_gpu.get((host, uuid), "")
            try:
                gi = int(idx)
            except ValueError:
                logger.warning("GPU %s on %s has no index label: skipped", uuid or "?", host or "?")
                continue
            if not 0 <= gi < 1 << 16:
                logger.warning("GPU %s on %s has an impossible index %r: skipped", uuid or "?", host or "?", idx)
                continue
            own = labels.get(i, {})
            model = own.get("modelName") or info.get((host, gpu, uuid, ""), "")
            t = target.get((host, gi, uuid, gi_id))
            if t is None:
                t = target[(host, gi, uuid, gi_id)] = len(target)
                tlabels.append(dict(own))
                models.append("")
            else:
                for label, value in own.items():
                    tlabels[t].setdefault(label, value)
            if model:
                models[t] = short_model(model)
            sources.append(i)
            targets.append(t)
        keys = sorted(target, key=lambda k: (k[0], k[1], k[2], int(k[3]) if k[3].isdigit() else -1, k[3]))
        order = np.fromiter((target[k] for k in keys), dtype=np.int64, count=len(keys))
        src, dst = np.asarray(sources, dtype=np.int64), np.asarray(targets, dtype=np.int64)
        recs = [tlabels[t] for t in order.tolist()]
        merged_cols: dict[str, np.ndarray] = {}
        expected = max(1, round(primary / step))

        def col(name: str) -> np.ndarray:
            got = merged_cols.get(name)
            if got is None:
                out = np.full(len(target), np.nan)
                values = raw.get(name)
                if values is not None:
                    v = values[src]
                    ok = ~np.isnan(v)
                    out[dst[ok]] = v[ok]  # in the raw rows' order: the last number given wins
                got = merged_cols[name] = out[order]
            return got

        def count(name: str) -> np.ndarray:
            return np.nan_to_num(col(name), nan=0.0).astype(np.int64)

        last_ts = col("last_ts")
        n = count(f"n@{primary:g}")
        stale = (n < sw.min_sample_ratio * expected) | ~(now - np.nan_to_num(last_ts, nan=-np.inf) <= sw.max_staleness)
        frame = pd.DataFrame({
            "host": pd.Series([k[0] for k in keys], dtype=object),
            "gpu": np.array([k[1] for k in keys], dtype=np.int64),
            "uuid": pd.Series([k[2] for k in keys], dtype=object),
            "model": pd.Series([models[t] for t in order.tolist()], dtype=object),
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
            "bursts_lb": count("bursts_lb"),
            "n_lb": count("n_lb"),
            **mem_trend(col("mem_slope_lb"), col("mem_var_lb"), col("mem_tvar_lb"), col("mem_n_lb"),
                        col("mem_t0_lb"), col("mem_t1_lb")),
            "stale": stale.astype(bool),
            "util_chart_lb": chart_text(np.stack([col(f"chart_{k}") for k in range(CHART_BUCKETS)], axis=1)),
        })[list(GPU_COLUMNS)]
        if any(k[3] for k in keys):
            frame = with_mig(frame, mig_columns(keys, recs))
        self.extras = {}
        for dk, r, temp in zip(keys, recs, col("temp").tolist(), strict=True):
            ek: tuple[Any, ...] = dk if dk[3] else dk[:3]
            self.extras[ek] = {"pod": r.get("pod", ""), "namespace": r.get("namespace", ""), "temp_c": temp}
        extra = {w: _window_frame(pd, col, len(keys), w, step, sw, last_ts, now) for w in others}
        return frame, extra

    def _together(self, calls: Sequence[Any]) -> list[Any]:
        """Run independent queries at the same time, :data:`PARALLEL_QUERIES` at most; return their answers
        in order (the first error is raised)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(len(calls), PARALLEL_QUERIES), thread_name_prefix="gpu-cost-promql") as pool:
            futures = [pool.submit(call) for call in calls]
            return [f.result() for f in futures]

    def _rules_plan(self, cur: list[Sample], policy: Any, at: float, now: float) -> Any:
        """Return how to read the recording rules' series (:class:`~gpu_cost.perceive.recording.Plan`), or None."""
        from gpu_cost.perceive import recording

        sw = policy.sweep
        rec = recording.plan(cur, step=float(sw.sample_interval), busy=float(sw.busy_util), lookback=float(sw.lookback),
                             selector=self.config.selector, at=at, now=now)
        if rec is None and any(s.metric.get("stat") == "rules" for s in cur):
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
            m = s.metric
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
    from gpu_cost.core.model import mig_share

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


def _window_frame(pd: Any, col: Any, rows: int, w: float, step: float, sw: Any,
                  last_ts: np.ndarray | None = None, at: float = 0.0) -> Any:
    """Return the window columns for another window length (as aggregate.extra_window); ``col(name)``
    gives a merged column of the frame's rows."""
    tag = f"{w:g}"
    expected = max(1, round(w / step))
    n = np.nan_to_num(col(f"n@{tag}"), nan=0.0).astype(np.int64)
    lt = last_ts if last_ts is not None else np.full(rows, np.nan)
    return pd.DataFrame({  # WINDOW_COLUMNS (no power_w: the primary window's is every rule's)
        "util_mean": col(f"util_mean@{tag}"), "util_max": col(f"util_max@{tag}"), "mem_min_mib": col(f"mem_min@{tag}"),
        "mem_max_mib": col(f"mem_max@{tag}"), "n_samples": n,
        "expected_samples": np.full(rows, expected, dtype=np.int64), "last_ts": lt,
        "stale": (n < sw.min_sample_ratio * expected) | ~(at - np.nan_to_num(lt, nan=-np.inf) <= sw.max_staleness),
    })
