"""The Prometheus connection: ``prometheus_api_client.PrometheusConnect`` for the small queries and the
connection's settings (TLS, a CA bundle, basic auth), ``msgspec`` for the large answers.

Two real servers: the session's ``prom_lab`` Prometheus, and a second Prometheus started here behind
TLS (a certificate of its own, signed by nobody the system trusts) and basic auth, scraping one of
``prom_lab``'s GPU exporters. The freshness sensor (``live.check_fresh``: the sweep's ``metrics_fresh``
and ``gpu-cost sweep --source prometheus``'s check) must answer through PrometheusConnect with the
CA bundle and the password the connection names, and fail with the sweep's usual problem texts
without them.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.core import free_port, need, stop_process
from tests.fixtures.prometheus import GPU_JOBS, PromLab

pytestmark = pytest.mark.integration

PASSWORD = "s3cure-Prom-pw"


def _spy(source: Any) -> tuple[list[str], list[str]]:
    """Record which way each query of ``source`` went (calling through to the real thing): the names
    PrometheusConnect asked (``custom_query``'s PromQL) and the API paths POSTed for msgspec."""
    library: list[str] = []
    posted: list[str] = []
    conn = source.client
    real_custom, real_post = conn.api.custom_query, conn.post

    def custom_query(query: str, *args: Any, **kwargs: Any) -> Any:
        library.append(query)
        return real_custom(query, *args, **kwargs)

    def post(path: str, form: Any, timeout: float) -> bytes:
        posted.append(form["query"])
        return real_post(path, form, timeout)  # type: ignore[no-any-return]

    conn.api.custom_query = custom_query
    conn.post = post
    return library, posted


def test_small_queries_go_through_prometheus_connect_and_large_answers_through_msgspec(
        prom_lab: PromLab, policy: Any) -> None:
    from prometheus_api_client import PrometheusConnect

    from gpu_cost.perceive import live
    from gpu_cost.perceive.prometheus import (
        PrometheusSource,
        current_query,
        freshness_query,
        lookback_query,
        nodes_query,
        rules_query,
    )

    # a worker's Prometheus may have just started: wait until the node exporter has the two scrapes a rate needs
    window = max(policy.rules.zombie.window, 4 * policy.sweep.sample_interval)
    deadline = time.time() + 60
    while not prom_lab.query(nodes_query('job="node"', window), time.time() - 6) and time.time() < deadline:
        time.sleep(1)
    now = time.time() - 6  # every sample up to it scraped and stored: the server's answers below are final
    source = PrometheusSource(prom_lab.config())
    assert isinstance(source.client.api, PrometheusConnect)
    library, posted = _spy(source)

    fresh, why = live.check_fresh(policy, now, prometheus=source)
    assert fresh, why
    # the sensor's answer is the server's own: the newest utilisation sample of every GPU
    (newest,) = prom_lab.query(freshness_query(""), now)
    assert why == f"newest GPU sample {max(now - float(newest['value'][1]), 0):.0f}s old"
    assert library == [freshness_query("")] and posted == []

    nodes = source.node_stats(policy, now)
    expected: dict[str, dict[str, float]] = {}
    for s in prom_lab.query(nodes_query('job="node"', window), now):
        expected.setdefault(s["metric"]["host"], {})[s["metric"]["stat"]] = float(s["value"][1])
    assert nodes and nodes == expected  # the server's own answer
    assert library[1:] == [nodes_query('job="node"', window)] and posted == []

    frame, _ = source.gpu_frame(policy, now)
    assert len(frame) > 0 and not frame["stale"].all()
    sw = policy.sweep
    assert library[2:] == [rules_query(sw.lookback)]  # the rules' two series: the library's
    assert current_query("") in posted  # thousands of series at scale: msgspec's
    assert lookback_query("", sw.lookback, float(sw.sample_interval), sw.busy_util) in posted
    assert len(posted) == 4 and source.queries_made == 1 + 1 + 1 + 4


def test_refusals_through_the_library_read_as_before(prom_lab: PromLab, policy: Any) -> None:
    """Prometheus's own error answer (HTTP 400, bad_data) names the server and the query, as on the msgspec path."""
    from gpu_cost.core.errors import SourceError
    from gpu_cost.perceive import live
    from gpu_cost.perceive.prometheus import PrometheusSource

    bad = PrometheusSource(prom_lab.config('job="unclosed'))
    fresh, why = live.check_fresh(policy, time.time(), prometheus=bad)
    assert not fresh
    assert why.startswith(f"Prometheus at {prom_lab.url} refused the freshness query: HTTP 400: bad_data: ")
    with pytest.raises(SourceError, match=r"refused the current query: HTTP 400: bad_data: "):
        bad.query('up{job="unclosed}', time.time(), "current")


class Secured:
    def __init__(self, url: str, ca: Path, proc: subprocess.Popen[bytes]) -> None:
        self.url, self.ca, self.proc = url, ca, proc


@pytest.fixture(scope="module")
def secured(prom_lab: PromLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A real Prometheus behind TLS and basic auth (user ``agent``), scraping one of prom_lab's exporters."""
    import crypt  # bcrypt, as Prometheus's web config wants it (Python 3.11; deprecated, not gone)

    import requests

    need("prometheus", "openssl")
    root = tmp_path_factory.mktemp("prom-tls")
    ca, key = root / "ca.pem", root / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(ca),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        hashed = crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))
    (root / "web.yml").write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(ca), "key_file": str(key)},
                                                  "basic_auth_users": {"agent": hashed}}))
    target = f"127.0.0.1:{prom_lab.ports[GPU_JOBS[0]]}"
    (root / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "gpu", "static_configs": [{"targets": [target]}]}]}))
    port = free_port()
    with open(root / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(["prometheus", f"--config.file={root / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={root / 'data'}", f"--web.config.file={root / 'web.yml'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # up, and one scrape in: the GPU series exist
            try:
                r = requests.get(f"{url}/api/v1/query", params={"query": 'up{job="gpu"} == 1'}, verify=str(ca),
                                 auth=("agent", PASSWORD), timeout=5)
                if r.ok and r.json()["data"]["result"]:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"TLS Prometheus not up: {(root / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.5)
        time.sleep(1.5)  # a second scrape: the newest sample is fresh
        yield Secured(url, ca, proc)
    finally:
        stop_process(proc)


@pytest.fixture
def conn_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Set the ``gpu_cost_prometheus`` connection (JSON, as Airflow reads it) for one test."""
    def put(url: str, **extra: Any) -> None:
        host = url.split("://", 1)[1]
        monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", json.dumps({
            "conn_type": "https", "host": host.split(":")[0], "port": int(host.split(":")[1]), "login": "agent",
            "password": extra.pop("password", PASSWORD), "extra": {"timeout": 10, **extra}}))
    return put


def test_the_connections_ca_bundle_and_password_reach_the_server(secured: Secured, conn_env: Any, policy: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    from gpu_cost.perceive import live
    from gpu_cost.perceive.prometheus import PrometheusSource, prometheus_config

    conn_env(secured.url, verify=str(secured.ca))
    config = prometheus_config()
    assert config.url == secured.url and config.verify == str(secured.ca)
    fresh, why = live.check_fresh(policy, time.time(), prometheus=PrometheusSource(config))
    assert fresh, why
    frame, _ = PrometheusSource(dataclasses.replace(config, recording_rules=False)).gpu_frame(policy, time.time())
    assert len(frame) > 0  # the large answers too: one session, one TLS setting, one password

    conn_env(secured.url, verify=False)
    fresh, why = live.check_fresh(policy, time.time())
    assert fresh, why  # the check turned off: answered all the same

    conn_env(secured.url)  # the system's CA store does not know this certificate
    fresh, why = live.check_fresh(policy, time.time())
    assert not fresh and why.startswith(f"Prometheus at {secured.url} cannot be reached (freshness query): SSLError")

    conn_env(secured.url, verify=str(secured.ca), password="wrong")
    fresh, why = live.check_fresh(policy, time.time())
    assert not fresh and why.startswith(f"Prometheus at {secured.url} refused the freshness query: HTTP 401")
    assert PASSWORD not in why + caplog.text


def test_a_ca_bundle_that_is_not_there_is_named(conn_env: Any, tmp_path: Path) -> None:
    from gpu_cost.core.errors import SourceError
    from gpu_cost.perceive.prometheus import prometheus_config

    conn_env("https://127.0.0.1:1", verify=str(tmp_path / "ca.pem"))
    with pytest.raises(SourceError, match=r"gpu_cost_prometheus: extra.verify is neither true/false nor a CA "
                                          r"bundle file: '.*/ca\.pem'"):
        prometheus_config()
