"""Fuzzed parsers: whatever Slurm, nvidia-smi or Prometheus answer, the source parses it or raises SourceError.

A sweep turns a ``SourceError`` into a *degraded* snapshot (nothing destructive acts); any other
exception type would crash the task instead and, worse, hide which source was wrong. Each
parser gets (a) arbitrary text, (b) arbitrary JSON values, and (c) real captured answers with
fields replaced by arbitrary values or cut off at an arbitrary byte. The Prometheus answers go
through the source's real HTTP client (requests, msgspec) from a loopback server, so decoding
errors are exercised too. Example counts are kept small: this is a guard, not a campaign.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_cost.core.errors import SourceError
from tests.fixtures.core import LoopbackHTTPServer

DATA = Path(__file__).resolve().parents[1] / "data"
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])

scalars = st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64) | st.floats() | st.text(max_size=30)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                                  max_size=5), max_leaves=20)


def _captured(name: str) -> dict[str, Any]:
    return json.loads((DATA / "slurm" / name).read_text(encoding="utf-8"))


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``doc`` (dict keys and list indices)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(doc))
    cur = copy
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return copy


def _parses_or_source_error(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except SourceError:
        pass


# -- Slurm JSON ------------------------------------------------------------------------------------
SLURM_DOCS = {"squeue": ("squeue-22.05.json", "squeue-24.05.json"), "sacct": ("sacct-22.05.json", "sacct-24.05.json"),
              "nodes": ("sinfo-22.05.json", "nodes-24.05.json", "sinfo-22.05-powered-down.json")}


def _slurm_parser(kind: str) -> Any:
    from gpu_cost.perceive import slurm

    return {"squeue": slurm.parse_jobs, "sacct": slurm.parse_sacct, "nodes": slurm.parse_nodes}[kind]


@FUZZ
@given(text=st.text(max_size=300) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_slurm_load_json_on_any_text(text: str) -> None:
    from gpu_cost.perceive.slurm import load_json

    try:
        doc = load_json(text, "squeue --json")
    except SourceError:
        return
    assert isinstance(doc, dict)


@FUZZ
@given(kind=st.sampled_from(sorted(SLURM_DOCS)), doc=json_values)
def test_slurm_parsers_on_any_json(kind: str, doc: Any) -> None:
    parse = _slurm_parser(kind)
    if isinstance(doc, dict):
        _parses_or_source_error(parse, doc)
    _parses_or_source_error(parse, {"jobs": doc, "nodes": doc})
    _parses_or_source_error(parse, {"sinfo": doc if isinstance(doc, list) else [doc]})  # sinfo --json of 23.x+


@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(SLURM_DOCS)))
def test_slurm_parsers_on_captured_answers_with_one_field_replaced(data: st.DataObject, kind: str) -> None:
    name = data.draw(st.sampled_from(SLURM_DOCS[kind]))
    doc = _captured(name)
    path = data.draw(st.sampled_from(_paths(doc)[1:]))
    bad = _replace(doc, path, data.draw(json_values))
    _parses_or_source_error(_slurm_parser(kind), bad)


@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(SLURM_DOCS)))
def test_slurm_truncated_answers(data: st.DataObject, kind: str) -> None:
    """A cut-off answer (the pipe closed, a full disk) is a SourceError, never a crash or a half list."""
    from gpu_cost.perceive.slurm import load_json

    name = data.draw(st.sampled_from(SLURM_DOCS[kind]))
    text = (DATA / "slurm" / name).read_text(encoding="utf-8")
    cut = data.draw(st.integers(min_value=0, max_value=len(text) - 2))
    truncated = text[:cut].rstrip()
    with pytest.raises(SourceError):
        _slurm_parser(kind)(load_json(truncated, f"{kind} --json"))


# -- nvidia-smi CSV and the node wrapper's inspect JSON ---------------------------------------------
@FUZZ
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=200)
       | st.lists(st.lists(st.sampled_from(["0", "GPU-1", "NVIDIA A100", "81920", "[N/A]", "12 MiB", "-3", "nan",
                                            "1e400", "", " ", "x", "99 %", "index"]), min_size=1, max_size=7)
                  .map(lambda r: ", ".join(r)), max_size=5).map("\n".join))
def test_nvidia_smi_csv(text: str) -> None:
    from gpu_cost.perceive.nodes import parse_apps, parse_gpus

    _parses_or_source_error(parse_gpus, text, "gpu01")
    _parses_or_source_error(parse_apps, text, "gpu01")


@FUZZ
@given(data=st.data())
def test_nvidia_smi_captured_csv_mutated(data: st.DataObject) -> None:
    from gpu_cost.perceive.nodes import parse_apps, parse_gpus

    for name, fn in (("query-gpu.csv", parse_gpus), ("query-compute-apps.csv", parse_apps),
                     ("query-gpu-units.csv", parse_gpus)):
        text = (DATA / "nvidia-smi" / name).read_text(encoding="utf-8")
        cut = data.draw(st.integers(min_value=0, max_value=len(text)))
        insert = data.draw(st.text(max_size=8))
        _parses_or_source_error(fn, text[:cut] + insert + text[cut:], "gpu01")


@FUZZ
@given(stat=st.text(max_size=120), cgroup=st.text(max_size=120))
def test_proc_stat_and_cgroup(stat: str, cgroup: str) -> None:
    from gpu_cost.perceive.nodes import container_from_cgroup, job_from_cgroup, start_ticks

    _parses_or_source_error(start_ticks, stat, "gpu01", 1)
    assert job_from_cgroup(cgroup) is None or job_from_cgroup(cgroup).isdigit()  # type: ignore[union-attr]
    assert container_from_cgroup(cgroup) is None or isinstance(container_from_cgroup(cgroup), str)


@FUZZ
@given(doc=json_values, gpus=st.text(max_size=80), apps=st.text(max_size=80), stat=st.text(max_size=60))
def test_node_inspect_json(doc: Any, gpus: str, apps: str, stat: str) -> None:
    from gpu_cost.perceive.nodes import parse_inspect

    _parses_or_source_error(parse_inspect, json.dumps(doc), "gpu01")
    shaped = {"verb": "inspect", "gpus": {"rc": 0, "stdout": gpus}, "apps": {"rc": 0, "stdout": apps},
              "btime": doc if not isinstance(doc, dict) else 1.0, "clk_tck": 100,
              "procs": {"1": {"stat": stat, "cgroup": gpus}} if not isinstance(doc, dict) else doc}
    _parses_or_source_error(parse_inspect, json.dumps(shaped), "gpu01")


# -- Prometheus answers, through the real HTTP client ------------------------------------------------
class _Answer:
    body: bytes = b"{}"
    status: int = 200
    #: what range queries get (None: ``body``)
    range_body: bytes | None = None


@pytest.fixture(scope="module")
def fake_prometheus() -> Iterator[tuple[str, _Answer]]:
    """A loopback HTTP server answering every query with whatever the test put in ``answer``."""
    answer = _Answer()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            body = answer.range_body if answer.range_body is not None and "query_range" in self.path else answer.body
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._reply()

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._reply()

        def log_message(self, *args: Any) -> None:
            pass

    server = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answer
    finally:
        server.shutdown()
        server.server_close()


sample_metric = st.fixed_dictionaries({}, optional={
    "host": st.sampled_from(["gpu01", "gpu02", ""]) | st.text(max_size=8),
    "gpu": st.sampled_from(["0", "1", "x", "", "-1", "99999999999999999999"]),
    "UUID": st.sampled_from(["GPU-a", "GPU-b", ""]),
    "stat": st.sampled_from(["last_ts", "mem_total", "temp", "index", "info", "util_mean@900", "util_max@900",
                             "n@900", "mem_min@900", "mem_max@900", "power@900", "util_mean_lb", "n_lb", "bursts_lb",
                             "cpu_util", ""]) | st.text(max_size=10),
    "modelName": st.text(max_size=20), "hpc_job": st.text(max_size=10), "name": st.text(max_size=10),
}) | json_values
sample_value = (st.tuples(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(
    ["0", "1", "-5", "NaN", "+Inf", "-Inf", "1e308", "1e400", "abc", "", "42.5"])).map(list) | json_values)
vector = st.lists(st.fixed_dictionaries({"metric": sample_metric, "value": sample_value}) | json_values, max_size=6)


@FUZZ
@given(result=vector, wrap=st.sampled_from(["ok", "no-data", "error", "raw"]))
def test_prometheus_answers(fake_prometheus: tuple[str, _Answer], policy: Any, result: Any, wrap: str) -> None:
    from gpu_cost.core.model import GPU_COLUMNS
    from gpu_cost.perceive.prometheus import PromConfig, PrometheusSource

    url, answer = fake_prometheus
    if wrap == "ok":
        doc: Any = {"status": "success", "data": {"resultType": "vector", "result": result}}
    elif wrap == "no-data":
        doc = {"status": "success", "data": result}
    elif wrap == "error":
        doc = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    else:
        doc = result
    answer.status, answer.body = 200, json.dumps(doc).encode()
    src = PrometheusSource(PromConfig(url=url, timeout=5))
    try:
        frame, _windows = src.gpu_frame(policy, 1795960800.0)
    except SourceError:
        pass
    else:
        # what parsed has the snapshot's shape: one row per GPU key, a boolean stale column
        assert list(frame.columns) == list(GPU_COLUMNS) and frame["stale"].dtype == bool
    for fn in (lambda: src.node_stats(policy, 1795960800.0), lambda: src.newest_sample_ts(1795960800.0)):
        _parses_or_source_error(fn)


@FUZZ
@given(body=st.binary(max_size=120), status=st.sampled_from([200, 400, 422, 500]))
def test_prometheus_raw_bodies(fake_prometheus: tuple[str, _Answer], policy: Any, body: bytes, status: int) -> None:
    from gpu_cost.perceive.prometheus import PromConfig, PrometheusSource

    url, answer = fake_prometheus
    answer.status, answer.body = status, body
    src = PrometheusSource(PromConfig(url=url, timeout=5))
    _parses_or_source_error(src.gpu_frame, policy, 1795960800.0)


range_series = st.lists(st.fixed_dictionaries({"metric": sample_metric, "values": st.lists(
    st.tuples(st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1795960800.0 - 1800 * k for k in range(14)]),
              st.sampled_from(["0", "1", "NaN", "+Inf", "-Inf", "abc", "", "1e400", "42.5"])).map(list) | json_values,
    max_size=4)}) | json_values, max_size=5)


@FUZZ
@given(result=range_series, wrap=st.sampled_from(["matrix", "vector", "raw"]))
def test_prometheus_chunk_reads(fake_prometheus: tuple[str, _Answer], policy: Any, result: Any, wrap: str) -> None:
    """Recording rules that fit, and whatever the range reads of their chunks answer: parsed or a SourceError."""
    from gpu_cost.core.model import GPU_COLUMNS
    from gpu_cost.perceive import recording
    from gpu_cost.perceive.prometheus import PromConfig, PrometheusSource

    url, answer = fake_prometheus
    now = 1795960800.0
    info = {"step": f"{policy.sweep.sample_interval:g}", "busy_util": f"{policy.sweep.busy_util:g}", "chunk": "1800"}
    rules = [{"metric": {**info, "stat": "rules"}, "value": [now, str(now)]},
             {"metric": {"__name__": recording.INFO, **info, "stat": "rules_since"}, "value": [now, "1"]},
             {"metric": {"host": "gpu01", "gpu": "0", "UUID": "GPU-a", "stat": "last_ts"}, "value": [now, str(now)]}]
    answer.status, answer.body = 200, json.dumps({"status": "success", "data": {"resultType": "vector",
                                                                                "result": rules}}).encode()
    doc: Any = {"status": "success", "data": {"resultType": wrap, "result": result}} if wrap != "raw" else result
    answer.range_body = json.dumps(doc).encode()
    src = PrometheusSource(PromConfig(url=url, timeout=5))
    try:
        frame, _windows = src.gpu_frame(policy, now)
    except SourceError:
        pass
    else:
        assert src.rules_used == "chunks"  # the range reads were asked and what they said was taken
        assert list(frame.columns) == list(GPU_COLUMNS) and frame["stale"].dtype == bool
    finally:
        answer.range_body = None
