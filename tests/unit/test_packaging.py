"""The runtime and development dependency sets: apart, locked with hashes, the same versions in both."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s*\\)?$")
DEV_ONLY = {"pytest", "pytest-timeout", "hypothesis", "time-machine", "playwright", "ruff", "mypy", "mkdocs",
            "mkdocs-material", "uv"}


def _lock(name: str) -> dict[str, tuple[str, int]]:
    """Return {package: (version, number of hashes)} of a lock file."""
    out: dict[str, tuple[str, int]] = {}
    current = None
    for line in (ROOT / name).read_text().splitlines():
        m = _PIN.match(line)
        if m:
            current = m.group(1).lower().replace("_", "-")
            out[current] = (m.group(2), 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, n = out[current]
            out[current] = (version, n + 1)
    return out


def test_the_runtime_lock_carries_no_development_tool() -> None:
    runtime = _lock("requirements.lock")
    assert "apache-airflow" in runtime and "prophet" in runtime
    assert not DEV_ONLY & set(runtime), sorted(DEV_ONLY & set(runtime))


def test_every_pin_carries_hashes_and_the_dev_lock_has_the_runtime_versions() -> None:
    runtime, dev = _lock("requirements.lock"), _lock("requirements-dev.lock")
    for name, lock in (("requirements.lock", runtime), ("requirements-dev.lock", dev)):
        unhashed = [p for p, (_, n) in lock.items() if n == 0]
        assert not unhashed, f"{name}: pins without --hash: {unhashed}"
    assert DEV_ONLY <= set(dev), sorted(DEV_ONLY - set(dev))
    differ = {p: (v, dev.get(p, (None,))[0]) for p, (v, _) in runtime.items() if dev.get(p, (None,))[0] != v}
    assert not differ, f"the dev lock must install the runtime lock's versions: {differ}"


def test_installs_verify_the_hashes() -> None:
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"uv pip sync .*--require-hashes .*requirements-dev\.lock", make)
    assert "--require-hashes" in (ROOT / "Dockerfile").read_text()
    assert "requirements-dev" not in (ROOT / "Dockerfile").read_text()
