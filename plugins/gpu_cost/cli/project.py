"""The project file, ``gpu-cost.toml``: the audit store ``gpu-cost`` uses in a folder and below it.

``gpu-cost`` looks for the file in the working directory, then in each parent folder (as git looks
for ``.git``); the nearest one counts. It holds one setting today::

    [store]
    db = ".demo/audit.db"   # a SQLite file (a relative path counts from this file's folder) or a SQLAlchemy URL

``--db``, ``GPU_COST_DB`` and the ``gpu_cost_db`` connection come before it
(:func:`gpu_cost.cli.options.resolve_store`); ``gpu-cost demo`` writes one naming its store. Unknown tables
or keys, and a value of the wrong type, are errors that name the file and the key.
"""

from __future__ import annotations

import json
import logging
import tomllib
from pathlib import Path
from typing import Any

from gpu_cost.core.errors import GpuCostError

logger = logging.getLogger(__name__)

FILE_NAME = "gpu-cost.toml"
#: the tables the file may hold, and each table's keys
_KEYS: dict[str, tuple[str, ...]] = {"store": ("db",)}


def find(start: Path | None = None) -> Path | None:
    """Return the nearest project file in ``start`` (default: the working directory) or a parent, or None."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / FILE_NAME
        if candidate.is_file():
            return candidate
    return None


def read(path: Path) -> dict[str, dict[str, Any]]:
    """Return the file's tables; raise GpuCostError naming the file (and the key) when it is malformed."""
    try:
        with path.open("rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise GpuCostError(f"{path}: cannot read the project file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise GpuCostError(f"{path}: not valid TOML: {exc}") from None
    for table, value in doc.items():
        if table not in _KEYS:
            raise GpuCostError(f"{path}: [{table}]: unknown table (known: {', '.join(sorted(_KEYS))})")
        if not isinstance(value, dict):
            raise GpuCostError(f"{path}: {table}: must be a table ([{table}]), not a {type(value).__name__}")
        for key in value:
            if key not in _KEYS[table]:
                raise GpuCostError(f"{path}: {table}.{key}: unknown key (known in [{table}]: "
                                   f"{', '.join(_KEYS[table])})")
    return doc


def store_db(path: Path) -> str | None:
    """Return the audit store the file names (``[store] db``): a SQLAlchemy URL as written, or a SQLite
    file path made absolute from the file's folder; None when the file names none."""
    value = read(path).get("store", {}).get("db")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise GpuCostError(f"{path}: store.db: must be a non-empty string (a SQLite file path or a SQLAlchemy URL), "
                           f"got {value!r}")
    text = value.strip()
    if "://" in text:
        return text
    return str((path.parent / Path(text).expanduser()).resolve())


def name_store(folder: Path, db: Path) -> dict[str, Any]:
    """Make ``folder``'s project file name the SQLite store ``db``, unless it names something else.

    Write the file when the folder has none; keep it when it names ``db`` already; otherwise leave
    it as it is. Return ``{"file", "written", "names_it", "note"}``: ``names_it`` says whether the
    file now names ``db``, ``note`` why not.
    """
    path = folder / FILE_NAME
    db = db.resolve()
    out: dict[str, Any] = {"file": str(path), "written": False, "names_it": False, "note": None}
    if path.exists():
        try:
            named = store_db(path)
        except GpuCostError as exc:
            out["note"] = str(exc)
            return out
        out["names_it"] = named is not None and "://" not in named and Path(named) == db
        if not out["names_it"]:
            out["note"] = f"{path} names {named or 'no store'}; left as it is"
        return out
    rel = db.relative_to(folder.resolve()) if db.is_relative_to(folder.resolve()) else db
    text = ("# gpu-cost project file: the audit store of `gpu-cost` run in this folder or below it, unless --db,\n"
            "# GPU_COST_DB or the gpu_cost_db connection names another (written by `gpu-cost demo`).\n"
            f"[store]\ndb = {json.dumps(rel.as_posix(), ensure_ascii=False)}\n")
    try:
        with path.open("x", encoding="utf-8") as fh:  # never over a file another process just wrote
            fh.write(text)
    except OSError as exc:
        out["note"] = f"{path}: could not write it: {exc.strerror or exc}"
        return out
    logger.debug("wrote %s naming the audit store %s", path, db)  # the demo's summary says so
    out.update(written=True, names_it=True)
    return out
