#!/usr/bin/env bash
# The one command that regenerates bench/RESULTS.md (see bench/README.md, "RESULTS.md").
#
#   bench/run.sh --quick          # ~10 min: short runs, few samples
#   bench/run.sh                  # the full run, for a quiet machine (~1.5 h)
#   bench/run.sh --only store,pgqueuer,procrastinate    # some parts (the others say "not run")
#   bench/run.sh --report-only bench/results/run-<stamp>.json   # render a saved run again
#
# Needs PostgreSQL at $HERDER_BENCH_POSTGRES (default postgresql://postgres@127.0.0.1:5432/test,
# trust auth; the peers' databases are created next to it), pgbench, and the shared peer
# scripts ($SHARED_BENCH, default ../shared/bench). Sets up what is missing: herder in
# <repo>/.venv, and the peers (PGQueuer, Procrastinate, asyncpg, psycopg) from PyPI in
# $VENV (default /tmp/peers-venv, where ../shared/bench expects them).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PY="$REPO/.venv/bin/python"
export VENV=${VENV:-/tmp/peers-venv}

if [ ! -x "$PY" ]; then
  echo "creating herder's venv at $REPO/.venv" >&2
  python3 -m venv "$REPO/.venv"
fi
if ! "$PY" -c 'import herder, psycopg, pytest, httpx' >/dev/null 2>&1; then
  echo "installing herder into $REPO/.venv" >&2
  "$PY" -m pip install -q --disable-pip-version-check -e "$REPO[dev]"
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the peers' venv at $VENV" >&2
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import pgqueuer, procrastinate, psycopg, psycopg_pool, asyncpg, uvloop' \
    >/dev/null 2>&1; then
  echo "installing the peers into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    pgqueuer procrastinate 'psycopg[binary]' psycopg-pool asyncpg uvloop
fi
SHARED=${SHARED_BENCH:-$REPO/../shared/bench}
if [ ! -f "$SHARED/common.py" ]; then
  echo "bench/run.sh: no shared bench scripts at $SHARED (common.py); set SHARED_BENCH" >&2
  exit 2
fi
export SHARED_BENCH=$(cd "$SHARED" && pwd)
cd "$REPO"
exec "$PY" "$HERE/run_results.py" "$@"
