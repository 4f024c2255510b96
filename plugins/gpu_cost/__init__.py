"""GPU Cost Agent: find and reclaim wasted GPU time on Slurm clusters, from Apache Airflow.

The library is importable without Airflow running; DAG files in ``dags/`` and the ``gpu-cost``
command line call the same functions.
"""

from __future__ import annotations

__version__ = "0.1.0"

# credentials in URLs never reach a log line of the package, whichever module logs first
from gpu_cost.core import redact as _redact  # noqa: F401
