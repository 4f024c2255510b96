"""Prophet, quietly: one import place, its logging silenced, fits counted for a summary line."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

_NOISY = ("cmdstanpy", "prophet", "prophet.plot", "prophet.models")


@dataclass
class FitStats:
    """What the Prophet fits of one task did, for the single summary line it logs."""

    fits: int = 0
    failed: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def summary(self, what: str) -> str:
        first = f"; first error: {self.errors[0]}" if self.errors else ""
        return f"prophet: {self.fits} {what} fit(s) in {self.seconds:.1f}s, {self.failed} failed{first}"


def silence() -> None:
    """Turn Prophet's and cmdstanpy's own logging down to errors (the callers log one summary)."""
    for name in _NOISY:
        lg = logging.getLogger(name)
        lg.setLevel(logging.ERROR)
        lg.propagate = False
    # cmdstanpy adds its own handler on import; drop it so nothing bypasses our level
    lg = logging.getLogger("cmdstanpy")
    for h in list(lg.handlers):
        lg.removeHandler(h)
    lg.addHandler(logging.NullHandler())


def prophet_class() -> Any:
    """Import and return ``prophet.Prophet`` with its logging silenced."""
    silence()
    logging.getLogger("prophet.plot").disabled = True
    from prophet import Prophet

    silence()
    return Prophet


#: the seed of Prophet's uncertainty sampling (:func:`predict`): the same fit gives the same bounds
PREDICT_SEED = 0


def predict(model: Any, df: Any, seed: int = PREDICT_SEED) -> Any:
    """Return ``model.predict(df)`` with its uncertainty sampling seeded.

    Prophet draws the samples behind ``yhat_lower``/``yhat_upper`` from NumPy's global generator: unseeded,
    the same fit gives other bounds on every run (and the power plan, which reads the upper bound, other
    decisions). The global generator's state is put back afterwards.
    """
    import numpy as np

    state = np.random.get_state()
    np.random.seed(seed)
    try:
        return model.predict(df)
    finally:
        np.random.set_state(state)


def fit(df: Any, stats: FitStats, **kwargs: Any) -> Any | None:
    """Fit a Prophet model on ``df`` (``ds`` tz-naive, ``y``); None (counted) when the fit fails."""
    cls = prophet_class()
    t0 = time.perf_counter()
    try:
        model = cls(**kwargs)
        model.fit(df)
    except Exception as exc:
        stats.failed += 1
        if len(stats.errors) < 3:
            stats.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
        return None
    finally:
        stats.fits += 1
        stats.seconds += time.perf_counter() - t0
    return model
