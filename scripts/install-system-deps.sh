#!/usr/bin/env bash
# Install the Debian packages that the integration tests run for real. Idempotent and quick when
# everything is present; does nothing (and says so) when not root.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "$1" ]; }
have slurmctld || need+=(slurm-wlm)
have slurmdbd || need+=(slurmdbd)
have munged || need+=(munge)
have mariadbd || need+=(mariadb-server)
have prometheus || need+=(prometheus)
have prometheus-node-exporter || need+=(prometheus-node-exporter)
have /usr/sbin/sshd || need+=(openssh-server)
have /usr/lib/postgresql/15/bin/postgres || need+=(postgresql)
have chromium || need+=(chromium)
have chromedriver || need+=(chromium-driver)
have redis-server || need+=(redis-server)
have faketime || need+=(faketime)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-system-deps: not root; missing ${need[*]} (their integration tests will skip)" >&2
  exit 0
fi
echo "install-system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts some of these as services on install; the tests start their own on loopback ports.
for svc in slurmctld slurmd slurmdbd munge mariadb prometheus prometheus-node-exporter ssh postgresql redis-server; do
  (command -v systemctl >/dev/null && systemctl stop "$svc" 2>/dev/null) || true
  (command -v service >/dev/null && service "$svc" stop >/dev/null 2>&1) || true
done
