"""``gpu-cost``: the same functions the DAGs call, from a shell.

Every subcommand takes ``--json`` and then prints exactly one JSON object on stdout; logs go to
stderr. Errors exit non-zero with a message naming what is wrong (and, with ``--json``, an
``{"error": ...}`` object). A command that opens the audit store says which one it read (``store``).

``gpu-cost --help`` imports every command module: they import heavy libraries (pandas,
SQLAlchemy, Airflow) inside their handlers only, so the help answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import pkgutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from gpu_cost import __version__
from gpu_cost.errors import GpuCostError

if TYPE_CHECKING:
    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger("gpu_cost")

Handler = Callable[[argparse.Namespace], tuple[dict[str, Any], str]]


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def add_policy(p: argparse.ArgumentParser, what: str = "policy file") -> None:
    p.add_argument("--policy", help=f"{what} (default: GPU_COST_POLICY or the shipped default)")


#: environment variable naming the audit store for every command (URL or SQLite file path)
DB_ENV = "GPU_COST_DB"
#: where ``gpu-cost demo`` (and ``make demo``) leave their audit store, relative to the working directory
DEMO_DB = Path(".demo") / "audit.db"


def add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL_OR_PATH",
                   help=f"audit store: a SQLAlchemy URL (sqlite:///..., postgresql+psycopg2://...) or a SQLite file "
                        f"path (default: {DB_ENV}, else the gpu_cost_db connection, else ./{DEMO_DB} when it is newer "
                        f"than ~/.gpu_cost/audit.db, else that file)")


class StoreChoice(NamedTuple):
    """The audit store a command reads, and why that one."""

    url: str
    #: ``--db``, ``GPU_COST_DB``, ``connection`` (gpu_cost_db), ``demo`` or ``default``
    origin: str

    def to_dict(self) -> dict[str, str]:
        from gpu_cost.redact import redact

        return {"url": redact(self.url), "origin": self.origin}

    def label(self) -> str:
        from gpu_cost.redact import redact

        why = {"demo": "the demo's", "connection": "connection gpu_cost_db", "default": "default"}
        return f"{redact(self.url)} ({why.get(self.origin, 'from ' + self.origin)})"


def resolve_store(db: str | None = None) -> StoreChoice:
    """Return the audit store the command line uses.

    Order: ``--db``, ``GPU_COST_DB``, the ``gpu_cost_db`` connection (``AIRFLOW_CONN_GPU_COST_DB``
    or Airflow's lookup); with none of them set, the demo's store (``./.demo/audit.db``) when it
    exists and was written after the default SQLite file (or that does not exist): a person who
    just ran the demo finds its decisions; else the default file. Every command prints which store
    it read. The DAGs resolve their store themselves (``gpu_cost.airflow.runtime``).
    """
    from gpu_cost.audit import connection

    if db:
        return StoreChoice(connection.url_from_text(db), "--db")
    env = os.environ.get(DB_ENV, "").strip()
    if env:
        return StoreChoice(connection.url_from_text(env), DB_ENV)
    url = connection.connection_url()
    if url is not None:
        return StoreChoice(url, "connection")
    default = connection.default_path()
    demo = DEMO_DB.resolve()
    if demo.is_file() and (not default.exists() or demo.stat().st_mtime >= default.stat().st_mtime):
        return StoreChoice(f"sqlite:///{demo}", "demo")
    return StoreChoice(f"sqlite:///{default}", "default")


def open_store(args: argparse.Namespace, *, ensure_schema: bool = True) -> AuditStore:
    """Open the store :func:`resolve_store` picks for ``args.db``; :func:`main` reports which one it was."""
    from gpu_cost.audit.store import AuditStore

    choice = resolve_store(getattr(args, "db", None))
    args.store_choice = choice
    store = AuditStore(choice.url)
    return store.ensure_schema() if ensure_schema else store


def duration_arg(value: str, flag: str) -> float:
    """Return the seconds of a duration typed on the command line; a bare number is an error (``--for 4``)."""
    from gpu_cost.timeutil import parse_duration_strict

    try:
        return parse_duration_strict(value)
    except ValueError as exc:
        raise GpuCostError(f"{flag} {value!r}: {exc}") from None


def instant_arg(value: str, flag: str, *, before: float | None = None) -> float:
    """Return the epoch of an ISO 8601 / epoch ``value``; with ``before``, a duration (``7d``) counts back from it.

    A bare number is epoch seconds, never a duration. Raises GpuCostError naming ``flag`` and the value.
    """
    from gpu_cost.timeutil import epoch, parse_duration_strict

    if before is not None:
        try:
            return before - parse_duration_strict(value)
        except ValueError:
            pass
    try:
        return epoch(value)
    except (TypeError, ValueError):
        kinds = "an ISO 8601 date/instant or epoch seconds" + (", nor a duration (e.g. 7d)" if before is not None else "")
        raise GpuCostError(f"{flag} {value!r}: not {kinds}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-cost", description="GPU Cost Agent: find and reclaim wasted GPU time.")
    parser.add_argument("--version", action="version", version=f"gpu-cost {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (stderr)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import gpu_cost.commands as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"gpu_cost.commands.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("cmdstanpy", "prophet", "matplotlib", "urllib3", "paramiko", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    as_json = bool(getattr(args, "json", False))
    try:
        payload, text = args.handler(args)
    except GpuCostError as exc:
        return _fail(str(exc), as_json, 2)
    except KeyboardInterrupt:
        return _fail("interrupted", as_json, 130)
    choice = getattr(args, "store_choice", None)
    if isinstance(choice, StoreChoice) and isinstance(payload, dict):
        payload = {**payload, "store": choice.to_dict()}
        text = f"{text.rstrip()}\nstore: {choice.label()}"
    if as_json:
        sys.stdout.write(json.dumps(payload, default=str) + "\n")
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")
    return int(payload.get("exit_code", 0)) if isinstance(payload, dict) else 0


def _fail(message: str, as_json: bool, code: int) -> int:
    sys.stderr.write(f"gpu-cost: error: {message}\n")
    if as_json:
        sys.stdout.write(json.dumps({"error": message}) + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
