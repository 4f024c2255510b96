"""The options and the store choice every ``gpu-cost`` command shares (``--json``, ``--policy``,
``--db``, instants and durations), so command modules import them without importing the parser.

The store is what ``--db``, ``GPU_COST_DB``, the ``gpu_cost_db`` connection or a project file names, in
that order, else the default (:func:`resolve_store`); a command that only reads never creates or
migrates one (:func:`open_store`).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from gpu_cost.core.errors import GpuCostError

if TYPE_CHECKING:
    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger("gpu_cost")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def add_policy(p: argparse.ArgumentParser, what: str = "policy file") -> None:
    p.add_argument("--policy", help=f"{what} (default: GPU_COST_POLICY or the shipped default)")


#: environment variable naming the audit store for every command (URL or SQLite file path)
DB_ENV = "GPU_COST_DB"


def add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL_OR_PATH",
                   help=f"audit store: a SQLAlchemy URL (sqlite:///..., postgresql+psycopg2://...) or a SQLite file "
                        f"path (default: {DB_ENV}, else the gpu_cost_db connection, else [store] db in the nearest "
                        "gpu-cost.toml here or in a parent folder, else ~/.gpu_cost/audit.db)")


class StoreChoice(NamedTuple):
    """The audit store a command reads, and why that one."""

    url: str
    #: ``--db``, ``GPU_COST_DB``, ``connection`` (gpu_cost_db), ``project`` (a gpu-cost.toml) or ``default``
    origin: str
    #: the project file that named it (origin ``project``)
    file: str | None = None

    def to_dict(self) -> dict[str, str]:
        from gpu_cost.core.redact import redact

        out = {"url": redact(self.url), "origin": self.origin}
        return {**out, "file": self.file} if self.file else out

    def why(self) -> str:
        """Return where the choice came from, as the ``store:`` line says it."""
        if self.origin == "project":
            return f"project file {self.file}"
        return {"connection": "connection gpu_cost_db", "default": "default"}.get(self.origin, f"from {self.origin}")

    def label(self) -> str:
        from gpu_cost.core.redact import redact

        return f"{redact(self.url)} ({self.why()})"


def resolve_store(db: str | None = None) -> StoreChoice:
    """Return the audit store the command line uses: the first of these that names one.

    ``--db``; ``GPU_COST_DB``; the ``gpu_cost_db`` connection (``AIRFLOW_CONN_GPU_COST_DB`` or
    Airflow's lookup); ``[store] db`` of the nearest project file (``gpu-cost.toml`` in the working
    directory or a parent, :mod:`gpu_cost.cli.project`); else the default SQLite file
    (``GPU_COST_HOME/audit.db``). Never a guess from what exists: every command prints which
    store it read and why. The DAGs resolve their store themselves (``gpu_cost.airflow.runtime``).
    """
    from gpu_cost.audit import connection
    from gpu_cost.cli import project

    if db:
        return StoreChoice(connection.url_from_text(db), "--db")
    env = os.environ.get(DB_ENV, "").strip()
    if env:
        return StoreChoice(connection.url_from_text(env), DB_ENV)
    url = connection.connection_url()
    if url is not None:
        return StoreChoice(url, "connection")
    found = project.find()
    named = project.store_db(found) if found is not None else None
    if found is not None and named is not None:
        return StoreChoice(connection.url_from_text(named), "project", str(found))
    return StoreChoice(f"sqlite:///{connection.default_path()}", "default")


def open_store(args: argparse.Namespace, *, writes: bool, needs_head: bool = True) -> AuditStore:
    """Open the store :func:`resolve_store` picks for ``args.db``; :func:`main` reports which one it was.

    :param writes: the command records something: the store is created, or migrated to head, as
        the DAGs do. A command that only reads changes nothing: a store that does not exist, or is
        behind this version's schema, is an error naming the way out (``gpu-cost db upgrade``).
    :param needs_head: False where the schema's revision is what the command shows (``db current``)
        or brings to head (``db upgrade``): the store is opened as it is.
    """
    from gpu_cost.audit.store import AuditStore

    choice = getattr(args, "store_choice", None)
    if not isinstance(choice, StoreChoice):
        choice = args.store_choice = resolve_store(getattr(args, "db", None))
    if writes:
        store = AuditStore(choice.url)
        return store.ensure_schema() if needs_head else store
    return _open_to_read(choice, needs_head, getattr(args, "db", None))


def _open_to_read(choice: StoreChoice, needs_head: bool, db: str | None) -> AuditStore:
    """Open an existing store without changing it; raise AuditError when there is none, or it is behind."""
    import sqlalchemy as sa

    from gpu_cost.audit.store import AuditStore
    from gpu_cost.core.errors import AuditError
    from gpu_cost.core.redact import redact

    upgrade = "`gpu-cost db upgrade`" + (" (with the same --db)" if choice.origin == "--db" and db else "")
    url = sa.engine.make_url(choice.url)
    file = url.database if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") else None
    where = file or redact(choice.url)

    def missing(what: str = "") -> AuditError:
        return AuditError(f"no audit store at {where} ({choice.why()}){what}: run {upgrade} or `make demo`, "
                          "or name one with --db")

    if file is not None and not Path(file).is_file():
        raise missing()  # checked before an engine exists: opening a SQLite file creates it
    store = AuditStore(choice.url)
    state = store.schema_state()
    if state["state"] == "empty" and needs_head:
        raise missing(", only a database without the audit tables")
    if state["state"] == "behind" and needs_head:
        raise AuditError(f"audit store {choice.label()} is at schema {state['current'] or 'before migrations'}, this "
                         f"version needs {state['head']}: run {upgrade} to migrate it (every row is kept); a command "
                         "that only reads changes nothing")
    return store.ensure_schema() if needs_head else store  # at head: ensure_schema runs no DDL


def duration_arg(value: str, flag: str) -> float:
    """Return the seconds of a duration typed on the command line; a bare number is an error (``--for 4``)."""
    from gpu_cost.core.timeutil import parse_duration_strict

    try:
        return parse_duration_strict(value)
    except ValueError as exc:
        raise GpuCostError(f"{flag} {value!r}: {exc}") from None


def instant_arg(value: str, flag: str, *, before: float | None = None) -> float:
    """Return the epoch of an ISO 8601 / epoch ``value``; with ``before``, a duration (``7d``) counts back from it.

    A bare number is epoch seconds, never a duration; a duration may carry a minus (``-3d``: the
    same 3 days ago as ``3d``). Raises GpuCostError naming ``flag`` and the value.
    """
    from gpu_cost.core.timeutil import epoch, parse_duration_strict

    if before is not None:
        try:
            return before - parse_duration_strict(value.strip().removeprefix("-"))
        except ValueError:
            pass
    try:
        return epoch(value)
    except (TypeError, ValueError):
        kinds = "an ISO 8601 date/instant or epoch seconds" + (", nor a duration (e.g. 7d)" if before is not None else "")
        raise GpuCostError(f"{flag} {value!r}: not {kinds}") from None
