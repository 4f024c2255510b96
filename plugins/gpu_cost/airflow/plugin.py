"""The package's Airflow plugin: the answers endpoint, served by the api-server.

Airflow finds it through ``plugins/gpu_cost_plugin.py`` in its plugins folder;
``plugins/.airflowignore`` keeps Airflow's plugins-folder loader from importing the package's
modules a second time as loose files.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from gpu_cost.airflow.answers_api import app
from gpu_cost.decide.answers import URL_PREFIX


class GpuCostPlugin(AirflowPlugin):
    """Serves ``/gpu-cost/answers`` (Slack interactions and signed links) in the api-server."""

    name = "gpu_cost"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "GPU Cost Agent answers"}]
