"""``gpu-cost db``: the audit store's schema: where it stands, and bringing it to head."""

from __future__ import annotations

import argparse
from typing import Any

from gpu_cost.cli.options import add_db, add_json, open_store


def register(sub: Any) -> None:
    p = sub.add_parser("db", help="the audit store's schema: current revision, upgrade to head",
                       description="Schema migrations of the audit store (--db, GPU_COST_DB or the gpu_cost_db connection).")
    verbs = p.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    cur = verbs.add_parser("current", help="the store's revision and the head this version needs (changes nothing)")
    _common(cur)
    cur.set_defaults(handler=_current)
    up = verbs.add_parser("upgrade", help="migrate the store to head, keeping every row (run as the tables' owner)",
                          description="Migrate the audit store to head in one transaction, keeping every row; a "
                                      "store with no audit table is created at head. On PostgreSQL run it as the "
                                      "tables' owner (the agent's role may not run DDL); it then applies "
                                      "include/sql/grants.postgresql.sql too, unless --no-grants.")
    _common(up)
    up.add_argument("--no-grants", action="store_true", help="PostgreSQL: do not (re)apply grants.postgresql.sql")
    up.set_defaults(handler=_upgrade)


def _common(p: argparse.ArgumentParser) -> None:
    add_db(p)
    # the flag this command had before --db: scripts keep working
    p.add_argument("--url", dest="db", help=argparse.SUPPRESS)
    add_json(p)


def _current(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.audit.connection import redact

    store = open_store(args, writes=False, needs_head=False)  # reading the revision changes nothing
    st = store.schema_state()
    out = {"url": redact(store.url), **st}
    text = f"{out['url']}: {st['current'] or 'no revision'} (head {st['head']}{', up to date' if st['at_head'] else ''})"
    return out, text


def _upgrade(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    import sqlalchemy as sa

    from gpu_cost.audit.connection import redact
    from gpu_cost.core import paths
    from gpu_cost.core.errors import AuditError

    store = open_store(args, writes=True, needs_head=False)  # upgrade brings the schema itself
    out: dict[str, Any] = {"url": redact(store.url), **store.upgrade(), "grants": False}
    if store.dialect == "postgresql" and not args.no_grants:
        grants = (paths.include_dir() / "sql" / "grants.postgresql.sql").read_text(encoding="utf-8")
        try:
            with store.engine.begin() as conn:
                conn.exec_driver_sql(grants)
        except sa.exc.SQLAlchemyError as exc:
            raise AuditError(f"grants.postgresql.sql failed on {out['url']}: "
                             f"{str(getattr(exc, 'orig', exc)).strip().splitlines()[0][:300]}") from exc
        out["grants"] = True
    if out["from"] == out["to"]:
        text = f"{out['url']}: already at {out['to']}"
    else:
        text = f"{out['url']}: {out['from'] or ('nothing' if out['created'] else 'pre-migration schema')} → {out['to']}"
    if out["grants"]:
        text += " (grants applied)"
    return out, text


__all__ = ["register"]
