#!/usr/bin/env bash
# Run the test suite with the clock moved ahead, to find tests that depend on today's date.
#
#   scripts/test-clock-ahead.sh +30d [pytest args...]      # a month ahead (also: +7d, +1y, ...)
#
# Every process the suite starts sees the moved clock through libfaketime (Debian package
# `faketime`), except what libfaketime cannot move or breaks, and those are said here:
# - Prometheus and node_exporter are Go programs (Go reads the clock without libc): their tests are
#   left out, since the agent would ask a Prometheus that lives today for samples a month ahead;
# - Chromium's crash handler aborts under libfaketime: the UI tests that drive it are left out
#   (the report page test, which starts Chromium without the UI server, still runs);
# - redis-server aborts under libfaketime: it keeps the real clock (a broker keeps no dates the
#   agent reads);
# - Python's time.sleep() fails with EINVAL under libfaketime (its absolute-deadline
#   clock_nanosleep): a sitecustomize for the run sleeps in select() instead. It does not reach
#   Airflow's Celery scheduler and worker children (their sleeps fail and they exit: the Celery
#   tests are left out), nor the system Python, whose own sitecustomize comes first (the test that
#   needs a sleeping system-Python process to stay alive, test_no_pidfd_no_signal, is left out);
# - file times are the kernel's, never moved: the test that compares a checkpoint file's mtime
#   with the clock is left out.
# Monotonic clocks are not moved (FAKETIME_DONT_FAKE_MONOTONIC), so every timeout still works.
set -euo pipefail
cd "$(dirname "$0")/.."
shift_by="${1:?usage: $0 +30d [pytest args...]}"
shift
command -v faketime >/dev/null || { echo "test-clock-ahead: needs faketime (apt-get install faketime)" >&2; exit 2; }
test -x .venv/bin/python || { echo "test-clock-ahead: run make setup first" >&2; exit 2; }
helpers="$(mktemp -d)"
trap 'rm -rf "$helpers"' EXIT
cat > "$helpers/sitecustomize.py" <<'EOF'
import select as _select
import time as _time


def _sleep(secs, _sel=_select.select):
    if secs < 0:
        raise ValueError("sleep length must be non-negative")
    _sel([], [], [], secs)


_time.sleep = _sleep
EOF
mkdir -p "$helpers/bin"
redis="$(command -v redis-server || true)"
if [ -n "$redis" ]; then
  printf '#!/bin/sh\nunset LD_PRELOAD FAKETIME\nexec %s "$@"\n' "$redis" > "$helpers/bin/redis-server"
  chmod +x "$helpers/bin/redis-server"
fi
export FAKETIME_DONT_FAKE_MONOTONIC=1 PYTHONPATH="$helpers${PYTHONPATH:+:$PYTHONPATH}" PATH="$helpers/bin:$PATH"
echo "test-clock-ahead: the suite's clock is $(faketime -f "$shift_by" date -u +%FT%TZ) (moved $shift_by)" >&2
exec faketime -f "$shift_by" .venv/bin/python -m pytest \
  --deselect tests/integration/test_exporter_hostile_values.py \
  --deselect tests/integration/test_faults_data.py \
  --deselect tests/integration/test_live.py \
  --deselect tests/integration/test_prometheus.py \
  --deselect tests/integration/test_prometheus_connection.py \
  --deselect tests/integration/test_prometheus_mig.py \
  --deselect tests/integration/test_secrets_prometheus.py \
  --deselect tests/integration/test_celery_scale.py \
  --deselect tests/integration/test_job_log.py::test_a_checkpoint_written_in_the_working_directory \
  --deselect tests/integration/test_nodes_ssh.py::test_no_pidfd_no_signal \
  --deselect tests/unit/test_bench_smoke.py::test_queries_bench_smoke \
  --deselect tests/e2e/test_ui_browser.py \
  "$@"
