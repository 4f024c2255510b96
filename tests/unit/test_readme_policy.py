"""The README's annotated policy is the shipped policy file, byte for byte (a test fails when they drift)."""

from __future__ import annotations

from tests.fixtures.core import ROOT

MARK = "The shipped policy, annotated:\n\n```yaml\n"


def test_the_readme_shows_the_shipped_policy() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index(MARK) + len(MARK)
    shown = readme[start:readme.index("```", start)]
    assert shown == (ROOT / "include" / "policy" / "default.yaml").read_text(encoding="utf-8"), (
        "README.md's policy block differs from include/policy/default.yaml: paste the file into the block")
