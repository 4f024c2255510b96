"""slurmrestd as a source, over real HTTP, for each Slurm version's answers.

The test machines run Debian 12's Slurm 22.05: its ``slurmrestd`` package only speaks OpenAPI
v0.0.36-v0.0.38 and its Slurm build has no ``auth/jwt`` plugin for slurmctld (only slurmrestd's
``rest_auth_jwt.so``), so no real token could be checked. A real HTTP server on 127.0.0.1 plays
slurmrestd here instead: it
serves the per-version answers of ``tests/data/slurm/<version>/`` (constructed from SchedMD's
data_parser tables, see the README there) at slurmrestd's paths, and checks the JWT the way
``auth/jwt`` does (HS256 signature with the cluster's key, ``exp``, ``sun`` = the user name in
``X-SLURM-USER-NAME``). What is real: the HTTP client, headers, status handling and parsing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.perceive import slurmrestd
from gpu_cost.perceive.slurmrestd import default_source
from tests.data.slurm.construct import T0, VERSIONS
from tests.fixtures.core import LoopbackHTTPServer

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
KEY = b"jwt-key-of-the-test-cluster-0123456789abcdef"
USER = "gpucost"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(user: str, exp: float, key: bytes = KEY) -> str:
    """An HS256 token as ``scontrol token`` makes one (claims ``exp``, ``iat``, ``sun``)."""
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"exp": int(exp), "iat": int(time.time()), "sun": user}).encode())
    sig = b64(hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


def valid(token: str, user: str) -> bool:
    try:
        head, body, sig = token.split(".")
        good = b64(hmac.new(KEY, f"{head}.{body}".encode(), hashlib.sha256).digest())
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except ValueError:
        return False
    return hmac.compare_digest(good, sig) and claims.get("exp", 0) > time.time() and claims.get("sun") == user


RESERVATIONS = {"reservations": [{"name": "maint-gpu03", "accounts": "ops,-guests", "users": "", "partition": "gpu",
                                  "node_list": "gpu[03-04]", "node_count": 2, "flags": ["MAINT", "SPEC_NODES"],
                                  "start_time": {"set": True, "infinite": False, "number": T0 + 3600},
                                  "end_time": {"set": True, "infinite": False, "number": T0 + 7200}}],
                "errors": [], "warnings": []}


class FakeRestd(BaseHTTPRequestHandler):
    """slurmrestd's GET paths for one data_parser version, answered from the version's files."""

    seen: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        FakeRestd.seen.append((parts.path, parse_qs(parts.query), dict(self.headers)))
        if not valid(self.headers.get("X-SLURM-USER-TOKEN", ""), self.headers.get("X-SLURM-USER-NAME", "")):
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        by_api = {v[0]: release for release, v in VERSIONS.items()}
        bits = parts.path.strip("/").split("/")
        release = by_api.get(bits[1]) if len(bits) >= 3 else None
        if release is None:
            self.reply(404, {"errors": [{"error": f"Unable find requested URL {parts.path}"}]})
            return
        files = DATA / release
        if bits[0] == "slurm" and bits[2] == "jobs":
            self.reply(200, json.loads((files / "squeue.json").read_text()))
        elif bits[0] == "slurm" and bits[2] == "nodes":
            self.reply(200, json.loads((files / "nodes.json").read_text()))
        elif bits[0] == "slurm" and bits[2] == "reservations":
            self.reply(200, RESERVATIONS)
        elif bits[0] == "slurm" and bits[2] == "job" and len(bits) == 4:
            doc = json.loads((files / "squeue.json").read_text())
            doc["jobs"] = [j for j in doc["jobs"] if str(j["job_id"]) == bits[3]]
            if not doc["jobs"]:
                self.reply(404, {"errors": [{"error": "Invalid job id specified", "error_number": 2017}]})
                return
            self.reply(200, doc)
        elif bits[0] == "slurmdb" and bits[2] == "jobs":
            self.reply(200, json.loads((files / "sacct.json").read_text()))
        else:
            self.reply(404, {"errors": [{"error": f"Unable find requested URL {parts.path}"}]})


@pytest.fixture(scope="module")
def restd() -> Iterator[LoopbackHTTPServer]:
    server = LoopbackHTTPServer(("127.0.0.1", 0), FakeRestd)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def conn(server: LoopbackHTTPServer, api: str, token: str) -> str:
    return json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": server.server_address[1], "login": USER,
                       "password": token, "extra": {"api_version": api, "timeout": 10, "scheme": "http"}})


@pytest.mark.parametrize("release", list(VERSIONS))
def test_every_reading_over_http(restd: LoopbackHTTPServer, monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    api = VERSIONS[release][0]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLURMRESTD", conn(restd, api, jwt(USER, time.time() + 600)))
    FakeRestd.seen.clear()
    src = default_source()
    assert isinstance(src, slurmrestd.SlurmRestSource)
    jobs = {j.job_id: j for j in src.jobs()}
    assert sorted(jobs) == ["7001", "7002", "7003_2", "7010"]
    assert jobs["7002"].gpu_alloc == (("gpu01", (2,)), ("gpu02", (0,)))
    nodes = {n.name: n.state for n in src.nodes()}
    assert nodes == {"gpu01": "mixed", "gpu02": "mixed", "gpu03": "idle~", "gpu04": "drained"}
    done = src.finished_jobs(T0 - 10000, T0)
    assert [j.job_id for j in done] == ["6990", "6991"] and done[0].gpus_requested == 2
    one = src.job("7001")
    assert one is not None and one.user == "alice"
    assert src.job("9999") is None
    (resv,) = src.reservations()
    assert resv.nodes == ("gpu03", "gpu04") and resv.accounts == ("ops",) and resv.flags == ("MAINT", "SPEC_NODES")
    paths = [p for p, _, _ in FakeRestd.seen]
    assert paths == [f"/slurm/{api}/jobs/", f"/slurm/{api}/nodes/", f"/slurmdb/{api}/jobs/", f"/slurm/{api}/job/7001",
                     f"/slurm/{api}/job/9999", f"/slurm/{api}/reservations/"]
    query = FakeRestd.seen[2][1]
    assert query == {"start_time": [str(T0 - 10000)], "end_time": [str(T0 + 1)]}
    assert all(h.get("X-SLURM-USER-NAME") == USER for _, _, h in FakeRestd.seen)


def test_an_expired_token_is_a_clear_error_that_never_shows_the_token(restd: LoopbackHTTPServer,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    token = jwt(USER, time.time() - 5)
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLURMRESTD", conn(restd, "v0.0.43", token))
    with pytest.raises(SourceError, match=r"refused GET /slurm/v0.0.43/jobs/ for user 'gpucost' \(HTTP 401\)") as err:
        slurmrestd.SlurmRestSource().jobs()
    assert token not in str(err.value) and token not in repr(slurmrestd.rest_config())


def test_a_token_signed_with_another_key_is_refused(restd: LoopbackHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLURMRESTD",
                       conn(restd, "v0.0.41", jwt(USER, time.time() + 600, key=b"not-the-cluster-key")))
    with pytest.raises(SourceError, match="HTTP 401"):
        slurmrestd.SlurmRestSource().nodes()


def test_a_version_slurmrestd_does_not_serve(restd: LoopbackHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLURMRESTD", conn(restd, "v0.0.39", jwt(USER, time.time() + 600)))
    src = slurmrestd.SlurmRestSource()
    src.config = slurmrestd.RestConfig(url=src.config.url, user=USER, token=src.config.token, api="v0.0.44")
    assert src.nodes()  # served
    src.config = slurmrestd.RestConfig(url=src.config.url, user=USER, token=src.config.token, api="v0.0.38")
    with pytest.raises(SourceError, match="Unable find requested URL"):
        src.nodes()


def test_a_bad_job_id_never_becomes_a_url(restd: LoopbackHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLURMRESTD", conn(restd, "v0.0.41", jwt(USER, time.time() + 600)))
    FakeRestd.seen.clear()
    with pytest.raises(SourceError, match="not a Slurm job id"):
        slurmrestd.SlurmRestSource().job("../nodes")
    assert FakeRestd.seen == []
