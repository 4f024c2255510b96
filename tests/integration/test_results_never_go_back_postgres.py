"""No write of the audit store goes back in time, on a real PostgreSQL (the guards' SQL is accepted there too).

The cases are those of ``tests/unit/test_results_never_go_back.py``: the newer write first, then the
older one, and the newer row stays.
"""

from __future__ import annotations

import pytest

from tests.unit.test_results_never_go_back import CASES

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_older_write_after_a_newer_one_leaves_the_newer_on_postgresql(pg_store, case: str) -> None:  # type: ignore[no-untyped-def]
    CASES[case](pg_store)
