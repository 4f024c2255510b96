"""The slurmrestd token goes to slurmrestd only: a redirect is an error, never followed with the token.

Two real HTTP servers on 127.0.0.1 (ports chosen at run time): the first plays a slurmrestd (or a
proxy in front of one) that answers every request with a redirect to the second; the second
records the headers it receives and answers a valid, empty job listing -- what an attacker's
server would do to hide the cluster's jobs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.perceive import slurmrestd
from tests.fixtures.core import LoopbackHTTPServer

pytestmark = pytest.mark.integration

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJncHVjb3N0In0.c2lnbmF0dXJl"
USER = "gpucost"


class Recorder(BaseHTTPRequestHandler):
    """The redirect's target: records what it was sent, answers a listing with no jobs."""

    seen: list[dict[str, str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        Recorder.seen.append(dict(self.headers))
        body = json.dumps({"jobs": [], "nodes": [], "errors": [], "warnings": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def redirector(target: str, status: int) -> type[BaseHTTPRequestHandler]:
    class Redirect(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Location", f"{target}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Redirect


def serve(handler: type[BaseHTTPRequestHandler]) -> tuple[LoopbackHTTPServer, threading.Thread]:
    server = LoopbackHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def recorder() -> Iterator[str]:
    server, thread = serve(Recorder)
    Recorder.seen.clear()
    # "localhost", not 127.0.0.1: another host name, as a real redirect elsewhere would be
    yield f"http://localhost:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_an_error_and_the_token_never_reaches_its_target(
        recorder: str, monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    server, thread = serve(redirector(recorder, status))
    port = server.server_address[1]
    try:
        monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLURMRESTD", json.dumps({
            "conn_type": "http", "host": "127.0.0.1", "port": port, "login": USER, "password": TOKEN,
            "extra": {"scheme": "http", "timeout": 10}}))
        src = slurmrestd.SlurmRestSource()
        with pytest.raises(SourceError) as err:
            src.jobs()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert Recorder.seen == []  # nothing followed the redirect, so no token reached the other server
    msg = str(err.value)
    assert f"slurmrestd at http://127.0.0.1:{port}" in msg and "GET /slurm/v0.0.41/jobs/" in msg
    assert f"a redirect (HTTP {status}) to {recorder}/slurm/v0.0.41/jobs/: not followed" in msg
    assert TOKEN not in msg and TOKEN not in repr(err.value.__cause__) and err.value.__cause__ is None
