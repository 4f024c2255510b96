"""``gpu-cost``: the same functions the DAGs call, from a shell.

Every subcommand takes ``--json`` and then prints exactly one JSON object on stdout; logs go to
stderr. Errors exit non-zero with a message naming what is wrong (and, with ``--json``, an
``{"error": ...}`` object).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import pkgutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpu_cost import __version__
from gpu_cost.errors import GpuCostError

logger = logging.getLogger("gpu_cost")

Handler = Callable[[argparse.Namespace], tuple[dict[str, Any], str]]


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def add_policy(p: argparse.ArgumentParser, what: str = "policy file") -> None:
    p.add_argument("--policy", help=f"{what} (default: GPU_COST_POLICY or the shipped default)")


def instant_arg(value: str, flag: str, *, before: float | None = None) -> float:
    """Return the epoch of an ISO 8601 / epoch ``value``; with ``before``, a duration (``7d``) counts back from it.

    Raises GpuCostError naming ``flag`` and the value.
    """
    from gpu_cost.timeutil import epoch, parse_duration

    if before is not None:
        try:
            return before - parse_duration(value)
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
    for noisy in ("cmdstanpy", "prophet", "matplotlib", "urllib3", "paramiko"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    as_json = bool(getattr(args, "json", False))
    try:
        payload, text = args.handler(args)
    except GpuCostError as exc:
        return _fail(str(exc), as_json, 2)
    except KeyboardInterrupt:
        return _fail("interrupted", as_json, 130)
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
