"""Shell globs, many at once: the policy's name and node patterns are asked of every job or finding of a sweep."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable


def any_glob(patterns: Iterable[str]) -> re.Pattern[str]:
    """Return one regex matching a whole string when any of the shell globs does (as ``fnmatchcase`` each)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
