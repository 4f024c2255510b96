"""The fixtures' XXH64 and the rule-group phase derived from it (which file name the rules backfill uses)."""

from __future__ import annotations

import pytest

from tests.fixtures.xxh64 import group_phase_ns, xxh64


@pytest.mark.parametrize(("data", "want"), [
    (b"", 0xEF46DB3751D8E999),
    (b"a", 0xD24EC4F1A98C6E5B),
    (b"abc", 0x44BC2CF5AD770999),
    (b"Nobody inspects the spammish repetition", 0xFBCEA83C8A378BF1),  # the 32-byte stripes and the tail
])
def test_xxh64_gives_the_published_digests(data: bytes, want: int) -> None:
    assert xxh64(data) == want


@pytest.mark.parametrize(("file", "phase_ns"), [
    ("rules-0.yml", 31_758_975_997),
    ("rules-53.yml", 59_783_647_772),
])
def test_group_phase_is_where_promtool_evaluated_the_group(file: str, phase_ns: int) -> None:
    # measured: promtool 2.42, given these file names (run in their folder), wrote group "g" (interval 1m)
    # at 31.759 s and 59.784 s into each minute; the second lost the evaluation before each 2-hour block
    # boundary (298 of 300 samples over 5 hours)
    assert group_phase_ns(file, "g", 60_000_000_000) == phase_ns
