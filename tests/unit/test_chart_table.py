"""Many chart texts parsed at once read as each parsed alone: the replica sets' peaks read tens of thousands."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpu_cost.perceive.aggregate import chart_text
from gpu_cost.perceive.snapshot import chart_table, chart_values


def _text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.1:
        return ""  # no chart
    width = rng.choice([1, 2, 12, 12, 12, 24])
    if kind < 0.2:
        fields = [rng.choice(["", "nan", "0", " 7", "1e2", "85.5"]) for _ in range(width)]  # read as float() reads
        return ",".join(fields)
    maxima = np.array([[np.nan if rng.random() < 0.2 else rng.uniform(0, 100) for _ in range(width)]])
    return chart_text(maxima)[0]  # as the snapshot writes them


@pytest.mark.parametrize("seed", range(8))
def test_each_row_is_the_text_read_alone(seed: int) -> None:
    rng = random.Random(seed)
    for _case in range(50):
        texts = [_text(rng) for _ in range(rng.randint(0, 30))]
        lengths, table = chart_table(texts)
        assert lengths.tolist() == [len(chart_values(t)) if t else 0 for t in texts]
        assert table.shape == (len(texts), max([1, *lengths.tolist()]))
        for row, t in zip(table, texts, strict=True):
            alone = chart_values(t) if t else ()
            np.testing.assert_array_equal(row[:len(alone)], np.array(alone, dtype=float))
            assert np.isnan(row[len(alone):]).all()


def test_a_field_that_is_no_number_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="x"):
        chart_table(["0,5", "1,x"])
    lengths, table = chart_table(["5,,7", "1_000"])
    assert lengths.tolist() == [3, 1]
    assert table[0].tolist() == [5.0, -1.0, 7.0] and table[1, 0] == 1000.0 and np.isnan(table[1, 1:]).all()
