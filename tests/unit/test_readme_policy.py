"""The policy page's annotated policy is the shipped policy file, byte for byte (a test fails when they drift).

The block lives in ``docs/policy.md`` (it used to be in the README, which now links to it).
"""

from __future__ import annotations

from tests.fixtures.core import ROOT

MARK = "The shipped policy, annotated:\n\n```yaml\n"
PAGE = ROOT / "docs" / "policy.md"


def test_the_policy_page_shows_the_shipped_policy() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert MARK in page, f"{PAGE.relative_to(ROOT)} lost its block starting {MARK!r}"
    start = page.index(MARK) + len(MARK)
    shown = page[start:page.index("```", start)]
    assert shown == (ROOT / "include" / "policy" / "default.yaml").read_text(encoding="utf-8"), (
        "docs/policy.md's policy block differs from include/policy/default.yaml: paste the file into the block")
