"""Airflow's entry to the package's plugin (the answers endpoint the api-server serves).

Airflow imports every loose ``.py`` file of its plugins folder and registers the
``AirflowPlugin`` classes it finds; ``.airflowignore`` keeps it from importing the package's own
modules that way. The plugin itself is :class:`gpu_cost.airflow.plugin.GpuCostPlugin`.
"""

from gpu_cost.airflow.plugin import GpuCostPlugin

__all__ = ["GpuCostPlugin"]
