#!/usr/bin/env bash
# Roles and database of the audit store (connection `gpu_cost_db`), on the audit PostgreSQL server.
#
# Run once by the postgres image on a fresh data volume (/docker-entrypoint-initdb.d), as the
# server's superuser; safe to run again by hand. The tables are then created (or migrated to the
# head revision, keeping every row) and granted by the owner: service `gpu-cost-db-init` runs
# `gpu-cost db upgrade` (Alembic migrations, then include/sql/grants.postgresql.sql).
#
#   gpu_cost_owner   owns the database and the tables; runs DDL; nothing else uses it
#   gpu_cost_agent     the agent (Airflow connection gpu_cost_db): SELECT; INSERT only into the run, decision
#                      and action history, never an approval; UPDATE of a few state columns (snapshots,
#                      escalations, results)
#   gpu_cost_approver  the approval operator (Airflow connection gpu_cost_db_approver): SELECT; INSERT of
#                      approval events only
#   gpu_cost_reader    Grafana and reports: SELECT only
#
# A store set up before the approver's role existed: run this again (as the superuser, with
# GPU_COST_APPROVER_PASSWORD set), then `gpu-cost db upgrade` as the owner.
#
# Passwords come from the environment (see .env.example); psql quotes them (:'var'), so any
# character is safe.
set -euo pipefail

: "${GPU_COST_DB_NAME:=gpu_cost}"
: "${GPU_COST_OWNER_PASSWORD:?set GPU_COST_OWNER_PASSWORD}"
: "${GPU_COST_AGENT_PASSWORD:?set GPU_COST_AGENT_PASSWORD}"
: "${GPU_COST_APPROVER_PASSWORD:?set GPU_COST_APPROVER_PASSWORD}"
: "${GPU_COST_READER_PASSWORD:?set GPU_COST_READER_PASSWORD}"

psql -v ON_ERROR_STOP=1 -X -q --username "${POSTGRES_USER:-postgres}" --dbname postgres \
    -v db="$GPU_COST_DB_NAME" \
    -v owner_pw="$GPU_COST_OWNER_PASSWORD" \
    -v agent_pw="$GPU_COST_AGENT_PASSWORD" \
    -v approver_pw="$GPU_COST_APPROVER_PASSWORD" \
    -v reader_pw="$GPU_COST_READER_PASSWORD" <<'EOSQL'
SELECT format('CREATE ROLE %I LOGIN', r) FROM unnest(ARRAY['gpu_cost_owner', 'gpu_cost_agent', 'gpu_cost_approver',
                                                   'gpu_cost_reader']) AS r
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) \gexec
ALTER ROLE gpu_cost_owner LOGIN PASSWORD :'owner_pw';
ALTER ROLE gpu_cost_agent LOGIN PASSWORD :'agent_pw';
ALTER ROLE gpu_cost_approver LOGIN PASSWORD :'approver_pw';
ALTER ROLE gpu_cost_reader LOGIN PASSWORD :'reader_pw';
SELECT format('CREATE DATABASE %I OWNER gpu_cost_owner', :'db')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', :'db') \gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO gpu_cost_agent, gpu_cost_approver, gpu_cost_reader', :'db') \gexec
EOSQL
echo "gpu_cost roles and database ${GPU_COST_DB_NAME} ready"
