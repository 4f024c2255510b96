# GPU Cost Agent: Apache Airflow 3.3 with the project's pinned dependencies and the gpu_cost package.
# Built by `docker compose build` (docker-compose.yaml); usable alone, e.g. in a Helm deployment.
# Pin by digest with scripts/pin-base-image.sh (needs a Docker client that reaches the registry).
FROM apache/airflow:3.3.2-python3.11

# Every dependency at the version the tests ran with (requirements.lock pins apache-airflow itself).
COPY --chown=airflow:root requirements.lock /tmp/requirements.lock
RUN pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock && rm /tmp/requirements.lock

# The project laid out as in the repository, under AIRFLOW_HOME: dags/ is the DAG folder, the
# package lives in plugins/gpu_cost, its shipped files (policies, SQL, templates) in include/.
# Installed editable so that compose's mounts of plugins/ and include/ take effect without a rebuild.
COPY --chown=airflow:root pyproject.toml README.md /opt/airflow/
COPY --chown=airflow:root plugins/gpu_cost /opt/airflow/plugins/gpu_cost
COPY --chown=airflow:root plugins/gpu_cost_plugin.py plugins/.airflowignore /opt/airflow/plugins/
COPY --chown=airflow:root include /opt/airflow/include
COPY --chown=airflow:root dags /opt/airflow/dags
# The DAG processor parses every file every few minutes in a fresh process: with the bytecode
# compiled here it reads .pyc instead of compiling the package's modules at each parse, even where
# PYTHONDONTWRITEBYTECODE keeps Python from writing them itself (docs/benchmarks.md).
RUN pip install --no-cache-dir --no-deps -e /opt/airflow \
    && python -m compileall -q /opt/airflow/plugins/gpu_cost /opt/airflow/dags

ENV GPU_COST_INCLUDE=/opt/airflow/include \
    AIRFLOW__CORE__LOAD_EXAMPLES=false

# Fails the build when the package or a DAG dependency cannot be imported.
RUN python -c "import gpu_cost, gpu_cost.cli.main, gpu_cost.airflow.plugin, airflow.providers.celery, airflow.providers.postgres" \
    && gpu-cost --help > /dev/null
