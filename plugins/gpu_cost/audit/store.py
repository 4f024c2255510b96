"""The audit store: decisions, actions, escalations, usage, savings, forecasts.

SQLAlchemy Core over the ``gpu_cost_db`` connection; the schema and every statement live in
``include/sql/``, schema changes in :mod:`gpu_cost.audit.migrations`. Writes are idempotent (``ON
CONFLICT``): writing the same decision twice keeps one row, and an action row exists before its
effect starts. Decisions and actions are history: what was decided and started is written once
(``gpu_cost_decision_log``, ``gpu_cost_action_log``), every later status change, approval and
outcome is a new event row, and ``gpu_cost_decisions`` / ``gpu_cost_actions`` are views of the
current state; so are runs (``gpu_cost_run_log`` + ``gpu_cost_run_events``, view ``gpu_cost_runs``).
Nothing is deleted or rewritten. Stored results (usage, forecasts, savings, baselines, outcomes,
snapshots, escalation ladders) name their run or data instant; an older instant never replaces a newer one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
import operator
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpu_cost.audit.connection import APPROVER_CONN_ID, audit_url, redact
from gpu_cost.core import paths
from gpu_cost.core.errors import AuditError
from gpu_cost.core.model import MODES, RUN_STATUSES, Decision
from gpu_cost.core.timeutil import epoch, iso

logger = logging.getLogger(__name__)

#: result writes whose rows carry ``run_id`` and ``data_ts``; the column that gives a row's data
#: instant when its writer names none (the row's own instant: what a run at that instant saw)
_RESULT_INSTANT = {"upsert_usage": "ts", "upsert_job_usage": "ts", "insert_saving": "ts", "upsert_forecast": "created_at"}
#: columns a later migration added to a write, NULL when the writer names them not (a row built by
#: code, a test or a tool of the earlier shape)
_OPTIONAL = {"upsert_job_usage": ("gpus_needed", "mem_max_mib", "mem_total_mib")}

#: the columns of a write that take a word of a vocabulary, and its words (defined once, in
#: :mod:`gpu_cost.core.model`): a mode is the policy's, a status what happened to a run; NULL is
#: "not known" (a run whose policy could not be loaded has no mode). The store's tables carry no CHECK
#: constraint (adding one needs a migration), so the write path holds them.
_VOCABULARY: dict[str, dict[str, tuple[str, ...]]] = {
    "insert_run": {"mode": MODES},
    "finish_run": {"status": RUN_STATUSES},
    "insert_decision": {"mode": MODES},
}

_TIME_COLUMNS = {
    "started_at", "finished_at", "data_ts", "ts", "approved_at", "first_seen", "last_seen", "last_action_at",
    "closed_at", "snoozed_until", "until_ts", "created_at", "horizon_ts", "pinned_at", "outcome_ts", "trained_at",
    "since_ts",
}


@functools.cache
def queries() -> dict[str, str]:
    """Return the named statements of ``include/sql/queries.sql``."""
    text = (paths.include_dir() / "sql" / "queries.sql").read_text(encoding="utf-8")
    out: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        # comment lines are for readers; a ":word" in one would look like a bind parameter
        body = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
        out[name.strip()] = body.strip().rstrip(";")
    return out


def schema_statements(dialect: str) -> list[str]:
    """Return the DDL statements for ``sqlite`` or ``postgresql``."""
    path = paths.include_dir() / "sql" / f"schema.{dialect}.sql"
    text = "\n".join(line.split("--", 1)[0] for line in Path(path).read_text(encoding="utf-8").splitlines())
    return [s.strip() for s in text.split(";") if s.strip()]


_ENGINES: dict[str, Engine] = {}
_LOCK = threading.Lock()


def _sqlite_engine(url: str, *pragmas: str, **connect_args: Any) -> Engine:
    """Return a new SQLite engine whose every connection starts with ``PRAGMA`` each of ``pragmas``."""
    eng = sa.create_engine(url, connect_args=connect_args)

    @sa.event.listens_for(eng, "connect")
    def _pragmas(dbapi_conn: Any, _rec: Any) -> None:
        cur = dbapi_conn.cursor()
        for pragma in pragmas:
            cur.execute(f"PRAGMA {pragma}")
        cur.close()

    return eng


def _engine(url: str) -> Engine:
    """Return the process's engine for ``url``; an in-memory SQLite URL gets a new, private one each time
    (a cached one would let a second replay in the same process read the first one's escalations)."""
    with _LOCK:
        private = url.startswith("sqlite") and url.split("///", 1)[-1] in ("", ":memory:")
        eng = None if private else _ENGINES.get(url)
        if eng is None and private:
            return sa.create_engine(url)
        if eng is None:
            if url.startswith("sqlite"):
                Path(url.split("///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
                eng = _sqlite_engine(url, "journal_mode=WAL", "busy_timeout=30000", timeout=30)
            else:
                eng = sa.create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})
            _ENGINES[url] = eng
        return eng


class AuditStore:
    """Read and write the audit tables.

    :param url: SQLAlchemy URL; default: resolved from the ``gpu_cost_db`` connection.
    :param engine: the engine to use for ``url`` instead of the process's shared one (:meth:`scratch`).
    """

    def __init__(self, url: str | None = None, *, engine: Engine | None = None) -> None:
        self.url = url or audit_url()
        self.engine = engine or _engine(self.url)
        self.dialect = "sqlite" if self.engine.dialect.name == "sqlite" else "postgresql"
        self._ready = False
        self._sql: dict[str, tuple[str, tuple[str, ...] | None]] = {}
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def scratch(cls) -> AuditStore:
        """Return a throwaway store (a replay's): a SQLite file in a temporary directory removed with the store.

        Its rows live on disk, not in the process's memory (a replayed week writes millions of usage
        rows), and nothing is synced to disk: nothing outlives the store. A transaction still rolls
        back whole (its journal is kept in memory).
        """
        tmp = tempfile.TemporaryDirectory(prefix="gpu-cost-scratch-")
        url = f"sqlite:///{Path(tmp.name) / 'audit.db'}"
        store = cls(url, engine=_sqlite_engine(url, "journal_mode=MEMORY", "synchronous=OFF"))
        store._scratch = tmp
        return store

    def __repr__(self) -> str:
        return f"AuditStore({redact(self.url)})"

    @property
    def path(self) -> str | None:
        """Return the SQLite file path, or None for a server database."""
        return self.url.split("///", 1)[1] if self.dialect == "sqlite" else None

    # -- plumbing ----------------------------------------------------------------------------
    def ensure_schema(self) -> AuditStore:
        """Bring the store to the schema this code needs (idempotent).

        A store at head is used as it is (no DDL: the agent's role may not own the tables). A
        SQLite store is created or migrated here. A PostgreSQL store not at head is migrated when
        the connected role may (the tables' owner, a superuser); otherwise AuditError names the
        command its owner runs.
        """
        if self._ready:
            return self
        from gpu_cost.audit import migrations

        try:
            with self.engine.connect() as conn:
                st = migrations.state(conn)
                allowed = st.at_head or migrations.can_migrate(conn)
            if not st.at_head:
                if not allowed:
                    raise AuditError(
                        f"audit store {redact(self.url)} is at schema {st.current or 'before migrations'}, this "
                        f"version needs {st.head}: as the tables' owner run `gpu-cost db upgrade --url "
                        f"<owner's URL>` (docker compose: `docker compose run --rm gpu-cost-db-init`)")
                migrations.upgrade(self.engine, schema_statements(self.dialect))
        except sa.exc.SQLAlchemyError as exc:
            raise AuditError(f"audit store {redact(self.url)} unavailable: {_short(exc)}") from exc
        self._ready = True
        return self

    def schema_state(self) -> dict[str, Any]:
        """Return ``{current, head, at_head, state}`` of the store's schema (no change made)."""
        from gpu_cost.audit import migrations

        try:
            with self.engine.connect() as conn:
                return migrations.state(conn).as_dict()
        except sa.exc.SQLAlchemyError as exc:
            raise AuditError(f"audit store {redact(self.url)} unavailable: {_short(exc)}") from exc

    def upgrade(self) -> dict[str, Any]:
        """Migrate the store to head as the connected role (its owner); return ``{from, to, created}``."""
        from gpu_cost.audit import migrations

        try:
            out = migrations.upgrade(self.engine, schema_statements(self.dialect))
        except sa.exc.SQLAlchemyError as exc:
            raise AuditError(f"audit store {redact(self.url)}: migration failed: {_short(exc)}") from exc
        self._ready = True
        return out

    def ping(self) -> None:
        """Raise AuditError unless the store answers."""
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except sa.exc.SQLAlchemyError as exc:
            raise AuditError(f"audit store {redact(self.url)} unavailable: {_short(exc)}") from exc

    def execute(self, name: str,
                params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | Columns | None = None) -> int:
        """Run a named write statement; return the affected row count.

        The statement is compiled for the store's driver once, and rows go to the driver as it takes
        them (a sweep writes hundreds of usage and member rows: SQLAlchemy would rebuild each row's
        parameters for its compiled form again). ``params`` is one row, a list of rows, or
        :class:`Columns`: many rows given column by column (a 100,000-GPU sweep's usage rows), written
        as the same rows would be."""
        self.ensure_schema()
        sql, order = self._driver_sql(name)
        if isinstance(params, Columns):
            return self._write(name, sql, params.args(name, order or _named_params(sql), named=order is None), True)
        many = isinstance(params, Sequence) and not isinstance(params, Mapping)
        batch: Sequence[Mapping[str, Any]] = params if many else [params or {}]  # type: ignore[assignment,list-item]
        rows = [_bind(_defaults(name, p)) for p in batch]
        if not rows:
            return 0
        if name in _VOCABULARY:
            _check_vocabulary(name, lambda column: (r.get(column) for r in rows))
        if order is not None:
            try:
                pick = operator.itemgetter(*order) if len(order) > 1 else (lambda r: (r[order[0]],))
                args: list[Any] = [pick(r) for r in rows] if order else [()] * len(rows)
            except KeyError as exc:
                raise AuditError(f"audit write {name}: no value for its parameter {exc.args[0]!r}") from None
        else:
            args = rows
            names = _named_params(sql)
            for r in rows:
                lacking = [k for k in names if k not in r]
                if lacking:
                    raise AuditError(f"audit write {name}: no value for its parameter {lacking[0]!r}")
        return self._write(name, sql, args, many)

    def _write(self, name: str, sql: str, args: list[Any], many: bool) -> int:
        """Hand the rows' parameters to the driver in one transaction; return the affected row count."""
        if not args:
            return 0
        with self._driver(f"audit write {name}") as cur:
            if many:
                cur.executemany(sql, args)
            else:
                cur.execute(sql, args[0])
            return int(cur.rowcount or 0)

    @contextlib.contextmanager
    def _driver(self, what: str) -> Iterator[Any]:
        """Yield a cursor of one of the engine's pooled connections, for statements already in the driver's form
        (:meth:`_driver_sql`): its transaction is committed when the block ends and rolled back when it raises; the
        connection goes back to the pool. The driver's and the pool's errors become an AuditError naming ``what``.

        A sweep makes thousands of small reads and writes: SQLAlchemy's execution layer around each (a connection
        object, an execution context, a result) cost more than the statement itself did.
        """
        errors: tuple[type[Exception], ...] = (sa.exc.SQLAlchemyError, self.engine.dialect.loaded_dbapi.Error)
        try:
            raw = self.engine.raw_connection()
        except errors as exc:
            raise AuditError(f"{what} failed on {redact(self.url)}: {_short(exc)}") from exc
        try:
            cur = raw.cursor()
            try:
                yield cur
            finally:
                cur.close()
            raw.commit()
        except errors as exc:
            raise AuditError(f"{what} failed on {redact(self.url)}: {_short(exc)}") from exc
        finally:
            raw.close()  # back to the pool, which rolls back what was not committed

    def _driver_sql(self, name: str) -> tuple[str, tuple[str, ...] | None]:
        """Return a named statement as the driver takes it and, for a positional driver, its parameters' order."""
        found = self._sql.get(name)
        if found is None:
            compiled = sa.text(queries()[name]).compile(dialect=self.engine.dialect)
            found = self._sql[name] = (compiled.string,
                                       tuple(compiled.positiontup or ()) if compiled.positional else None)
        return found

    def fetch(self, name: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run a named query; return rows as dicts with times as epoch seconds."""
        self.ensure_schema()
        lists = [k for k, v in (params or {}).items() if isinstance(v, list | tuple)]
        if not lists:  # the statement as the driver takes it, compiled once (a list is expanded for its length)
            sql, order = self._driver_sql(name)
            bound = _bind(params or {})
            lacking = [k for k in (order if order is not None else _named_params(sql)) if k not in bound]
            if lacking:
                raise AuditError(f"audit read {name}: no value for its parameter {lacking[0]!r}")
            args = tuple(bound[k] for k in order) if order is not None else bound
            with self._driver(f"audit read {name}") as cur:
                cur.execute(sql, args)
                columns = [d[0] for d in cur.description]
                found = cur.fetchall()
            return [_row(zip(columns, r, strict=True)) for r in found]
        stmt = sa.text(queries()[name])
        if lists:
            stmt = stmt.bindparams(*(sa.bindparam(k, expanding=True) for k in lists))
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(stmt, _bind(params or {})).mappings().all()
        except sa.exc.SQLAlchemyError as exc:
            raise AuditError(f"audit read {name} failed on {redact(self.url)}: {_short(exc)}") from exc
        return [_row(r) for r in rows]

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run ad-hoc read-only SQL (reports, tests)."""
        self.ensure_schema()
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(sa.text(sql), _bind(params or {})).mappings().all()]

    def scan(self, sql: str, params: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Yield the rows of read-only SQL one at a time, as :meth:`query` gives them (a week's usage, not held whole)."""
        self.ensure_schema()
        with self.engine.connect() as conn:
            result = conn.execution_options(stream_results=True, yield_per=2000).execute(sa.text(sql),
                                                                                       _bind(params or {}))
            for r in result.mappings():
                yield _row(r)

    # -- runs and snapshots -----------------------------------------------------------------
    def begin_run(self, run_id: str, *, dag_id: str, started_at: float, data_ts: float, source: str | None,
                  mode: str | None) -> None:
        """Write a run's log row; ``mode`` is one of :data:`~gpu_cost.core.model.MODES`, None when no policy was
        loaded (anything else is refused: what happened to the run is its status, :meth:`finish_run`); ``source``
        None when no policy said which it is."""
        self.execute("insert_run", {"run_id": run_id, "dag_id": dag_id, "started_at": started_at, "data_ts": data_ts,
                                    "source": source, "mode": mode})

    def finish_run(self, run_id: str, *, status: str, finished_at: float, problems: Iterable[str] = (),
                   counts: Mapping[str, Any] | None = None) -> None:
        """Append a run's status event; ``status`` is one of :data:`~gpu_cost.core.model.RUN_STATUSES`."""
        self.execute("finish_run", {"run_id": run_id, "status": status, "finished_at": finished_at,
                                    "problems": json.dumps(list(problems)), "counts": json.dumps(dict(counts or {}))})

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        rows = self.fetch("get_run", {"run_id": run_id})
        return rows[0] if rows else None

    def save_snapshot(self, run_id: str, ts: float, payload: str) -> None:
        self.execute("save_snapshot", {"run_id": run_id, "ts": ts, "payload": payload})

    def load_snapshot(self, run_id: str) -> str:
        """Return what was parked under ``run_id``; AuditError when nothing is, or it was released."""
        rows = self.fetch("load_snapshot", {"run_id": run_id})
        if not rows:
            raise AuditError(f"no snapshot stored for run {run_id!r}")
        if not rows[0]["payload"]:
            raise AuditError(f"the state parked for run {run_id!r} was released (older than the policy's "
                             "sweep.keep_parked): trigger a new run instead of retrying this one")
        return str(rows[0]["payload"])

    def release_parked(self, until: float) -> int:
        """Empty the parked state (:meth:`save_snapshot`) written for data instants before ``until``; return how many
        rows. Only a run's own tasks read it; its decisions, actions and usage rows are untouched."""
        return self.execute("release_parked", {"until": until})

    # -- decisions ----------------------------------------------------------------------------
    def record_decisions(self, decisions: Iterable[Decision], run_id: str, status: str = "decided") -> int:
        """Insert decisions; ones already present (same id) are kept as they are. Return rows inserted."""
        rows = [decision_row(d, run_id, status) for d in decisions]
        return self.execute("insert_decision", rows) if rows else 0

    def get_decision(self, decision_id: str) -> dict[str, Any] | None:
        rows = self.fetch("get_decision", {"decision_id": decision_id})
        return rows[0] if rows else None

    def decisions_of_run(self, run_id: str) -> list[dict[str, Any]]:
        return self.fetch("decisions_of_run", {"run_id": run_id})

    def decisions_by_ids(self, ids: Iterable[str]) -> list[dict[str, Any]]:
        """Return the current state of these decisions (as :meth:`get_decision`), in time order; unknown ids are left out."""
        wanted = list(dict.fromkeys(str(i) for i in ids))
        rows: list[dict[str, Any]] = []
        for start in range(0, len(wanted), 500):
            rows += self.fetch("decisions_by_ids", {"ids": wanted[start:start + 500]})
        return sorted(rows, key=lambda r: (float(r["ts"]), str(r["decision_id"])))

    def decision_events(self, decision_id: str) -> list[dict[str, Any]]:
        """Return the status changes and approval answers of a decision, oldest first (``event_id`` order)."""
        return self.fetch("decision_events", {"decision_id": decision_id})

    def set_decision_status(self, decision_id: str, status: str, *, run_id: str | None = None,
                            note: str | None = None, by: str | None = None) -> None:
        """Append a status change (nothing when the status is already ``status``)."""
        self.execute("set_decision_status", {"decision_id": decision_id, "status": status, "recorded_by": by,
                                             "run_id": run_id, "note": note})

    def set_approval(self, decision_id: str, status: str, by: str | None, at: float | None, *,
                     run_id: str | None = None, note: str | None = None) -> None:
        """Append an approval answer (``pending``, ``approved``, ``rejected``, ``timed_out``, ``refused``).

        On PostgreSQL only the approver's role (``gpu_cost_approver``, connection ``gpu_cost_db_approver``)
        may: the agent's role is refused, and this says so.
        """
        try:
            self.execute("set_approval", {"decision_id": decision_id, "approval_status": status, "approved_by": by,
                                          "approved_at": at, "run_id": run_id, "note": note})
        except AuditError as exc:
            if "permission denied" not in str(exc):
                raise
            raise AuditError(f"{exc}: an approval is written by the approver's role (connection {APPROVER_CONN_ID}, "
                             "PostgreSQL role gpu_cost_approver), never by the agent's") from None

    # -- actions ------------------------------------------------------------------------------
    def action_started(self, *, action_id: str, decision_id: str, run_id: str | None, action: str, target: str,
                       executor: str, dry_run: bool, started_at: float, command: str | None = None) -> bool:
        """Write the ``started`` row. Return False when a row for this action already exists."""
        n = self.execute("action_started", {
            "action_id": action_id, "decision_id": decision_id, "run_id": run_id, "action": action, "target": target,
            "executor": executor, "dry_run": int(dry_run), "started_at": started_at, "attempt": 1, "command": command,
        })
        return n > 0

    def action_finished(self, action_id: str, status: str, finished_at: float, output: str | None = None,
                        error: str | None = None) -> None:
        """Append the outcome of an action still ``started`` (an action already ended keeps its outcome)."""
        self.execute("action_finished", {"action_id": action_id, "status": status, "finished_at": finished_at,
                                         "output": _clip(output), "error": _clip(error)})

    def get_action(self, action_id: str) -> dict[str, Any] | None:
        rows = self.fetch("get_action", {"action_id": action_id})
        return rows[0] if rows else None

    def actions_of_decision(self, decision_id: str) -> list[dict[str, Any]]:
        return self.fetch("actions_of_decision", {"decision_id": decision_id})

    # -- escalations --------------------------------------------------------------------------
    def escalation(self, rule: str, target: str, track: str) -> dict[str, Any] | None:
        rows = self.fetch("get_escalation", {"rule": rule, "target": target, "track": track})
        return rows[0] if rows else None

    def open_escalations(self, track: str) -> list[dict[str, Any]]:
        return self.fetch("open_escalations", {"track": track})

    def active_snoozes(self, now: float) -> list[dict[str, Any]]:
        return self.fetch("active_snoozes", {"now": now})

    def table_counts(self) -> dict[str, int]:
        out = {}
        for t in ("gpu_cost_runs", "gpu_cost_decisions", "gpu_cost_actions", "gpu_cost_escalations", "gpu_cost_usage",
                  "gpu_cost_savings", "gpu_cost_forecasts", "gpu_cost_snapshots", "gpu_cost_decision_events",
                  "gpu_cost_action_events"):
            out[t] = int(self.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"])
        return out


class Columns(dict[str, Any]):
    """Rows given column by column for :meth:`AuditStore.execute`: column → a list (a value per row) or one value
    for every row. Lists hold what a driver takes (``ndarray.tolist()``'s values; numpy arrays are converted);
    the rows are bound as :meth:`AuditStore.execute` binds a list of rows: the statement's optional columns
    NULL, a result row's run and data instant defaulted, times written as the store writes them."""

    def args(self, name: str, params: Sequence[str], *, named: bool) -> list[Any]:
        """Return the driver's parameters of every row for the statement ``name`` taking ``params`` (in order)."""
        cols: dict[str, Any] = {k: v.tolist() if hasattr(v, "tolist") and not isinstance(v, str | bytes) else v
                                for k, v in self.items()}
        sizes = {len(v) for v in cols.values() if isinstance(v, list)}
        if len(sizes) > 1:
            raise AuditError(f"audit write {name}: columns of different lengths ({', '.join(map(str, sorted(sizes)))})")
        n = sizes.pop() if sizes else 1
        if not n:
            return []
        cols = dict(_defaults(name, cols))  # a list of data instants is taken as it is given
        for k, v in cols.items():
            if k in _TIME_PARAMS:
                cols[k] = [None if x is None else iso(x) for x in v] if isinstance(v, list) else (
                    None if v is None else iso(v))
            elif not isinstance(v, list) and type(v) not in _PLAIN and hasattr(v, "item"):
                cols[k] = v.item()
        _check_vocabulary(name, lambda column: set(v) if isinstance(v := cols.get(column), list) else {v})
        lacking = [k for k in params if k not in cols]
        if lacking:
            raise AuditError(f"audit write {name}: no value for its parameter {lacking[0]!r}")
        values = zip(*[cols[k] if isinstance(cols[k], list) else itertools.repeat(cols[k], n) for k in params],
                     strict=False)
        return [dict(zip(params, row, strict=True)) for row in values] if named else list(values)


def decision_row(d: Decision, run_id: str, status: str = "decided") -> dict[str, Any]:
    return {
        "decision_id": d.decision_id, "run_id": run_id, "ts": d.ts, "rule": d.rule, "target_kind": d.target_kind,
        "target": d.target, "action": d.action, "mode": d.mode, "rung": d.rung, "episode": d.episode, "job_id": d.job_id,
        "user_name": d.user, "account": d.account, "partition_name": d.partition, "host": d.host, "gpus": d.gpus,
        "reason": d.reason, "protection": d.protection, "requires_approval": int(d.requires_approval),
        "approval_status": "pending" if d.requires_approval and d.acts else None, "status": status,
        "gpu_hours_at_risk": round(d.gpu_hours_at_risk, 4), "gpu_hours_saved": round(d.gpu_hours_saved, 4),
        "evidence": json.dumps(dict(d.evidence), default=str),
    }


def _check_vocabulary(name: str, values: Callable[[str], Iterable[Any]]) -> None:
    """Raise AuditError naming the write, the column, the value and the words allowed, before any row is written.

    :param values: column → the values the write's rows give it (rows or :class:`Columns`)."""
    for column, words in _VOCABULARY.get(name, {}).items():
        for value in values(column):
            if value is not None and value not in words:
                raise AuditError(f"audit write {name}: {column} {value!r} is not one of {', '.join(words)}"
                                 + (" (a run's mode is its policy's; what happened to it is its status)"
                                    if column == "mode" and value in RUN_STATUSES else ""))


def _defaults(name: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
    """Give a result row whose writer named no run or data instant ``run_id`` NULL and its own instant,
    and the columns of :data:`_OPTIONAL` it does not name NULL."""
    optional = [c for c in _OPTIONAL.get(name, ()) if c not in params]
    if optional:
        params = {**params, **dict.fromkeys(optional)}
    instant = _RESULT_INSTANT.get(name)
    if instant is None or ("data_ts" in params and "run_id" in params):
        return params
    out = dict(params)
    out.setdefault("run_id", None)
    if out.get("data_ts") is None:
        out["data_ts"] = out.get(instant)
    return out


_TIME_PARAMS = frozenset(_TIME_COLUMNS | {"now", "since", "until", "until_ts"})
#: types a driver takes as they are (the common case, checked first: a sweep binds thousands of rows)
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _bind(params: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(params)
    for k, v in out.items():
        if k in _TIME_PARAMS:
            out[k] = None if v is None else iso(v)
        elif type(v) not in _PLAIN and hasattr(v, "item") and not isinstance(v, str | bytes):
            out[k] = v.item()  # numpy scalars: drivers do not know them (psycopg2 writes np.float64(...))
    return out


@functools.lru_cache(maxsize=256)
def _named_params(sql: str) -> tuple[str, ...]:
    """Return the ``%(name)s`` parameters of a statement compiled for a named-parameter driver."""
    return tuple(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))


def as_stored(params: Mapping[str, Any]) -> dict[str, Any]:
    """Return a row as the store gives it back once written: times at the store's second precision, as epochs."""
    out = dict(params)
    for k, v in out.items():
        if v is None:
            continue
        if k in _TIME_COLUMNS and (type(v) is int or (type(v) is float and math.isfinite(v) and v.is_integer())):
            out[k] = float(v)  # a whole second comes back as it went (a sweep writes hundreds of these)
        elif k in _TIME_PARAMS or type(v) not in _PLAIN:
            out[k] = _row(_bind({k: v}))[k]
    return out


def _row(r: Any) -> dict[str, Any]:
    out = dict(r)
    for k, v in out.items():
        if k in _TIME_COLUMNS and v is not None:
            out[k] = epoch(v)
    return out


def _clip(text: str | None, limit: int = 8000) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 20] + "\n...[truncated]"


def _short(exc: Exception) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    return text[:300]
