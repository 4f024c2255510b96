"""Slurm through ``slurmrestd``: the same answers as the commands, over HTTP with a JWT.

Where operators run ``slurmrestd`` instead of giving the agent a login node, the jobs, nodes,
finished jobs and reservations come from its REST API. The bodies are the JSON the commands print
(``squeue --json`` is ``GET /slurm/<v>/jobs/``), so :mod:`gpu_cost.perceive.slurm`'s parsers read
them, whatever the version (v0.0.39 of Slurm 23.02 to v0.0.44 of 25.11).

=========================================  ===========================================
``GET /slurm/<v>/jobs/``                   running and pending jobs
``GET /slurm/<v>/job/<job id>``            one job (the executors' re-check uses commands)
``GET /slurm/<v>/nodes/``                  nodes
``GET /slurm/<v>/reservations/``           reservations
``GET /slurmdb/<v>/jobs/?start_time&end_time``  finished jobs (needs slurmdbd)
=========================================  ===========================================

Authentication is ``auth/jwt`` (``AuthAltTypes=auth/jwt`` in slurm.conf and slurmrestd started
with ``-a rest_auth/jwt``): each request carries ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN``.

Connection ``gpu_cost_slurmrestd`` (Airflow ``http``): ``host`` and ``port`` (default 6820) of
slurmrestd, ``login`` the Slurm user the token is for, ``password`` the token (what
``scontrol token username=<login> lifespan=<s>`` prints after ``SLURM_JWT=``; when the
connection has none, the ``SLURM_JWT`` environment variable). Extras: ``api_version`` (the
data_parser version, default ``v0.0.41``; ``v0.0.39``-``v0.0.44``), ``scheme``, ``verify`` (TLS,
default true), ``timeout`` (seconds, default 30). The token is never logged: errors name the URL
and the HTTP status only.

The token travels over HTTPS unless the connection asks for plain HTTP in so many words: ``http``
in ``extra.scheme``, in ``schema`` (where Airflow's HTTP connections keep their scheme) or as the
host's ``http://`` prefix; where two of them are set they must agree. The ``http`` connection
type is not such a request (every HTTP connection has it). A redirect is never followed: the
token header would go with it to wherever it points (``requests`` drops only ``Authorization``
on the way), and that server's answer would be read as the cluster's. A 3xx answer is an error
naming the URL and where it pointed.

Actions still run as commands (``scancel``, ``scontrol``) through the Slurm runner.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_cost.core import connections
from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import Job, Node, Reservation
from gpu_cost.core.redact import redact
from gpu_cost.core.timeutil import epoch
from gpu_cost.perceive.slurm import (
    TERMINAL_STATES,
    SlurmSource,
    check_job_id,
    load_json,
    parse_jobs,
    parse_nodes,
    parse_sacct,
    reservations_from_json,
)

logger = logging.getLogger(__name__)

CONN_ID = "gpu_cost_slurmrestd"
DEFAULT_API = "v0.0.41"
DEFAULT_PORT = 6820
_API = re.compile(r"v0\.0\.(39|4[0-4])")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


@dataclass(frozen=True)
class RestConfig:
    """Where slurmrestd is and who the agent is to it (see the module docstring)."""

    url: str
    user: str
    token: str
    api: str = DEFAULT_API
    verify: bool = True
    timeout: float = 30.0

    def __repr__(self) -> str:  # the token never shows in a log or a traceback
        return f"RestConfig(url={self.url!r}, user={self.user!r}, api={self.api!r})"


def configured(conn_id: str = CONN_ID) -> bool:
    """True when the slurmrestd connection is set (nothing is contacted)."""
    try:
        return connections.lookup(conn_id, SourceError) is not None
    except SourceError:
        return False


def rest_config(conn_id: str = CONN_ID) -> RestConfig:
    """Read :class:`RestConfig` from the connection; SourceError naming the connection and the field."""
    conn = connections.lookup(conn_id, SourceError)
    var = connections.env_var(conn_id)
    if conn is None:
        raise SourceError(f"no slurmrestd connection: set the Airflow connection {conn_id} ({var})")
    extra: Mapping[str, Any] = conn.get("extra") or {}
    host = str(conn.get("host") or "").strip()
    if not host:
        raise SourceError(f"connection {conn_id}: host is empty (slurmrestd's address)")
    said: dict[str, str] = {}  # where the connection names a scheme: what it says
    if "://" in host:
        said["host"], _, host = host.partition("://")
    for where, value in (("extra.scheme", extra.get("scheme")), ("schema", conn.get("schema"))):
        if value not in (None, ""):
            said[where] = str(value)
    for where, value in said.items():
        if value.strip().lower() not in ("http", "https"):
            raise SourceError(f"connection {conn_id}: scheme must be http or https, not {value!r:.20} ({where})")
    schemes = {v.strip().lower() for v in said.values()}
    if len(schemes) > 1:
        raise SourceError(f"connection {conn_id}: " + ", ".join(f"{w} says {v!r}" for w, v in said.items())
                          + ": set one scheme")
    scheme = schemes.pop() if schemes else "https"
    port = conn.get("port") or DEFAULT_PORT
    user = str(conn.get("login") or "")
    if not _USER.fullmatch(user):
        raise SourceError(f"connection {conn_id}: login must be the Slurm user name the token is for, not {user!r:.40}")
    token = str(conn.get("password") or os.environ.get("SLURM_JWT", "")).strip()
    if not token:
        raise SourceError(f"connection {conn_id}: no token (its password, or SLURM_JWT in the environment)")
    api = str(extra.get("api_version") or DEFAULT_API)
    if not _API.fullmatch(api):
        raise SourceError(f"connection {conn_id}: extra.api_version {api!r} is not one of v0.0.39-v0.0.44")
    try:
        timeout = float(extra.get("timeout", 30.0))
    except (TypeError, ValueError):
        raise SourceError(f"connection {conn_id}: extra.timeout is not a number") from None
    verify = extra.get("verify", True)
    return RestConfig(url=f"{scheme}://{host.rstrip('/')}:{int(port)}", user=user, token=token, api=api,
                      verify=verify not in (False, "false", "False", "0", 0), timeout=timeout)


class SlurmRestSource:
    """Read jobs, nodes, finished jobs and reservations from slurmrestd (same results as :class:`SlurmSource`).

    :param config: where and who (default: the ``gpu_cost_slurmrestd`` connection).
    :param session: a ``requests.Session`` (built lazily otherwise).
    """

    def __init__(self, config: RestConfig | None = None, *, session: Any = None) -> None:
        self.config = config or rest_config()
        self._session = session

    @property
    def session(self) -> Any:
        if self._session is None:
            import requests

            s = requests.Session()
            s.headers.update({"X-SLURM-USER-NAME": self.config.user, "X-SLURM-USER-TOKEN": self.config.token,
                              "Accept": "application/json"})
            s.verify = self.config.verify
            self._session = s
        return self._session

    def _get(self, path: str, params: Mapping[str, str] | None = None, *, missing_ok: bool = False) -> dict[str, Any] | None:
        import requests

        url = f"{self.config.url}{path}"
        what = f"GET {path}"
        try:
            # never followed: the token header would go wherever a redirect points
            res = self.session.get(url, params=dict(params or {}), timeout=self.config.timeout,
                                   allow_redirects=False)
        except requests.exceptions.Timeout:
            raise SourceError(f"slurmrestd at {redact(self.config.url)} did not answer {what} within "
                              f"{self.config.timeout:g}s") from None
        except requests.exceptions.RequestException as exc:
            raise SourceError(f"slurmrestd at {redact(self.config.url)} cannot be reached ({what}): "
                              f"{type(exc).__name__}") from None
        if 300 <= res.status_code < 400:
            where = " ".join(str(res.headers.get("Location") or "nowhere").split())[:200]
            raise SourceError(f"slurmrestd at {redact(self.config.url)} answered {what} with a redirect "
                              f"(HTTP {res.status_code}) to {redact(where)}: not followed, the token goes to "
                              "slurmrestd only; point the connection at slurmrestd itself")
        if res.status_code in (401, 403):
            raise SourceError(f"slurmrestd at {redact(self.config.url)} refused {what} for user {self.config.user!r} "
                              f"(HTTP {res.status_code}): check the token (expired? auth/jwt configured?)")
        if missing_ok and res.status_code == 404:
            return None
        text = res.text
        if res.status_code >= 400 and not text.lstrip().startswith("{"):
            raise SourceError(f"slurmrestd at {redact(self.config.url)}: {what} answered HTTP {res.status_code}: "
                              f"{redact(' '.join(text.split()))[:200]}")
        if missing_ok and res.status_code >= 400 and "invalid job id" in text.lower():
            return None
        return load_json(text, f"slurmrestd {what}")

    def _path(self, kind: str, what: str) -> str:
        return f"/{kind}/{self.config.api}/{what}"

    def jobs(self) -> list[Job]:
        """Return running and pending jobs (``GET /slurm/<v>/jobs/``)."""
        doc = self._get(self._path("slurm", "jobs/"))
        assert doc is not None
        return [j for j in parse_jobs(doc, "slurmrestd GET jobs") if j.running or j.pending]

    def nodes(self) -> list[Node]:
        """Return every node (``GET /slurm/<v>/nodes/``)."""
        doc = self._get(self._path("slurm", "nodes/"))
        assert doc is not None
        return parse_nodes(doc, "slurmrestd GET nodes")

    def reservations(self, name: str | None = None) -> list[Reservation]:
        """Return reservations (``GET /slurm/<v>/reservations/``), or the one named ``name``."""
        doc = self._get(self._path("slurm", "reservations/"))
        assert doc is not None
        found = reservations_from_json(doc, "slurmrestd GET reservations")
        return [r for r in found if name is None or r.name == name]

    def finished_jobs(self, since: object, until: object) -> list[Job]:
        """Return jobs that ended in ``[since, until)`` (``GET /slurmdb/<v>/jobs/``)."""
        s, u = epoch(since), epoch(until)
        doc = self._get(self._path("slurmdb", "jobs/"), {"start_time": str(int(s)), "end_time": str(int(u) + 1)})
        assert doc is not None
        jobs = parse_sacct(doc, "slurmrestd GET slurmdb jobs")
        return [j for j in jobs if j.end_ts is not None and s <= j.end_ts < u and j.state in TERMINAL_STATES]

    def job(self, job_id: str) -> Job | None:
        """Return one job as slurmrestd shows it now, or None when it no longer lists it."""
        asked = check_job_id(job_id).split("_[", 1)[0]  # validated before it becomes part of a URL
        doc = self._get(self._path("slurm", f"job/{asked}"), missing_ok=True)
        if doc is None:
            return None
        for j in parse_jobs(doc, "slurmrestd GET job"):
            if j.job_id == str(job_id):
                return j
        return None


def default_source(**kwargs: Any) -> Any:
    """Return the Slurm reader this deployment uses: slurmrestd when its connection
    (``gpu_cost_slurmrestd``) is configured, else the commands (:class:`SlurmSource`)."""
    if configured():
        return SlurmRestSource()
    return SlurmSource(**kwargs)
