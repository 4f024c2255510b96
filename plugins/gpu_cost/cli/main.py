"""``gpu-cost``: the same functions the DAGs call, from a shell.

Every subcommand takes ``--json`` and then prints exactly one JSON object on stdout; logs go to
stderr. Errors exit non-zero with a message naming what is wrong (and, with ``--json``, an
``{"error": ...}`` object). A command that opens the audit store says which one it read (``store``),
errors included; a command that only reads never creates or migrates one (:func:`gpu_cost.cli.options.open_store`).

``gpu-cost --help`` imports every command module: they import heavy libraries (pandas,
SQLAlchemy, Airflow) inside their handlers only, so the help answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import pkgutil
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpu_cost import __version__
from gpu_cost.cli.options import StoreChoice, resolve_store
from gpu_cost.core.errors import GpuCostError

if TYPE_CHECKING:
    pass

logger = logging.getLogger("gpu_cost")

Handler = Callable[[argparse.Namespace], tuple[dict[str, Any], str]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-cost", description="GPU Cost Agent: find and reclaim wasted GPU time.")
    parser.add_argument("--version", action="version", version=f"gpu-cost {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (stderr)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import gpu_cost.cli.commands as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"gpu_cost.cli.commands.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


#: flags whose value may start with a minus (``--since -3d``): argparse would take it for an option
DASH_VALUE_FLAGS = ("--since", "--until")


def join_dash_values(argv: Sequence[str]) -> list[str]:
    """Return ``argv`` with ``--since -3d`` written ``--since=-3d``, which argparse reads as the flag's value.

    Only a value of a minus and a digit is joined: ``--since --json`` stays an error about a missing value.
    """
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        if items[i] in DASH_VALUE_FLAGS and i + 1 < len(items) and re.match(r"-\d", items[i + 1]):
            out.append(f"{items[i]}={items[i + 1]}")
            i += 2
            continue
        out.append(items[i])
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(join_dash_values(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("cmdstanpy", "prophet", "matplotlib", "urllib3", "paramiko", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    as_json = bool(getattr(args, "json", False))
    try:
        if hasattr(args, "db"):  # a command with --db opens a store: its answer, errors included, names it
            args.store_choice = resolve_store(args.db)
        payload, text = args.handler(args)
    except GpuCostError as exc:
        return _fail(str(exc), as_json, 2, getattr(args, "store_choice", None))
    except KeyboardInterrupt:
        return _fail("interrupted", as_json, 130, getattr(args, "store_choice", None))
    choice = getattr(args, "store_choice", None)
    if isinstance(choice, StoreChoice) and isinstance(payload, dict):
        payload = {**payload, "store": choice.to_dict()}
        text = f"{text.rstrip()}\nstore: {choice.label()}"
    if as_json:
        sys.stdout.write(json.dumps(payload, default=str) + "\n")
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")
    return int(payload.get("exit_code", 0)) if isinstance(payload, dict) else 0


def _fail(message: str, as_json: bool, code: int, choice: StoreChoice | None = None) -> int:
    store = f"\nstore: {choice.label()}" if choice is not None else ""
    sys.stderr.write(f"gpu-cost: error: {message}{store}\n")
    if as_json:
        sys.stdout.write(json.dumps({"error": message, **({"store": choice.to_dict()} if choice else {})}) + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
