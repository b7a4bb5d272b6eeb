#!/usr/bin/env bash
# run_all.sh hook: herder's rows in the same results table as the peers.
#
# run_all.sh runs every executable extra_*.sh with cwd = the shared bench folder and
# RESULTS, PGPORT, VENV, REPS exported:
#   EXTRAS_DIR=bench RESULTS_DIR=bench/results bash ../shared/bench/run_all.sh  (repo root)
# run_all's own PARTS selects the peers; HERDER_PARTS="enqueue claim sql raw latency" (default:
# all) and BACKENDS="pg sqlite" select herder's parts. Other knobs: see herder_bench.py.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
HVENV="$REPO/.venv"
PY="$HVENV/bin/python"

if [ ! -x "$PY" ]; then
  echo "  creating herder venv at $HVENV"
  python3 -m venv "$HVENV"
fi
if ! "$PY" -c 'import herder, psycopg, psycopg_pool' >/dev/null 2>&1; then
  echo "  installing herder into $HVENV"
  "$PY" -m pip install -q --disable-pip-version-check -e "$REPO" 2>&1 | grep -v '^WARNING' || true
  "$PY" -c 'import herder, psycopg, psycopg_pool' || { echo "herder install failed" >&2; exit 1; }
fi
versions="herder: $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown),\
 python $("$PY" -c 'import sys; print(sys.version.split()[0])'),\
 psycopg $("$PY" -c 'import psycopg; print(psycopg.__version__)'),\
 sqlite $("$PY" -c 'import sqlite3; print(sqlite3.sqlite_version)')"
echo "  $versions"
# run_all.sh names its env file after the results file; add herder's versions to it
if [ -n "${RESULTS:-}" ] && [ -f "${RESULTS%.jsonl}.env.txt" ]; then
  echo "$versions" >> "${RESULTS%.jsonl}.env.txt"
fi
# run_all.sh runs the extras from the shared folder; otherwise herder_bench.py finds it itself
if [ -z "${SHARED_BENCH:-}" ] && [ -f "$PWD/common.py" ]; then
  export SHARED_BENCH="$PWD"
fi
# run_all's PARTS names the peer parts ("raw pgqueuer ..."), not herder's: do not pass it on.
PARTS="${HERDER_PARTS:-enqueue claim sql raw latency}" exec "$PY" "$HERE/herder_bench.py"
