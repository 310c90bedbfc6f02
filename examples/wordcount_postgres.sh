#!/usr/bin/env bash
# Runs the wordcount_postgres example against a throw-away PostgreSQL:
# starts clusters in a temporary directory with .ci/postgres.sh (which
# installs PostgreSQL from Debian's packages if it is missing), runs the
# example with the arguments given here, and stops the clusters on exit.
#
#   examples/wordcount_postgres.sh                      # exactly-once
#   examples/wordcount_postgres.sh --idempotent --parallelism 3
#
# It keeps its own state file, so it neither reuses nor stops a server
# that `.ci/postgres.sh start` started for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

state_dir=$(mktemp -d "${TMPDIR:-/tmp}/snapflow-example-pg.XXXXXX")
export SNAPFLOW_PG_STATE="${state_dir}/state"
trap 'bash .ci/postgres.sh stop; rm -rf "${state_dir}"' EXIT
# An assignment, so that a failed start stops the script (`set -e` does
# not see a failure inside `eval "$(...)"`).
exports=$(bash .ci/postgres.sh start)
eval "${exports}"
echo "wordcount_postgres.sh: server at ${SNAPFLOW_POSTGRES_URL}" >&2
cargo run --release -p snapflow-examples --example wordcount_postgres -- \
  --url "${SNAPFLOW_POSTGRES_URL}" "$@"
