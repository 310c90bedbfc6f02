#!/usr/bin/env bash
# A throw-away PostgreSQL for snapflow's tests: three clusters in a temporary
# directory, reachable only through Unix sockets in that directory.
#
#   eval "$(.ci/postgres.sh start)"   # installs if missing, starts, prints exports
#   .ci/postgres.sh stop              # stops the clusters, deletes the directory
#   .ci/postgres.sh restart spare     # restarts one cluster (for the test of a
#                                     # server restart during a job)
#
# `start` prints three `export` lines on stdout (everything else goes to
# stderr):
#   SNAPFLOW_POSTGRES_URL              max_prepared_transactions = 64
#   SNAPFLOW_POSTGRES_NO_PREPARED_URL  max_prepared_transactions = 0, for the
#                                      test of the sink's setting check
#   SNAPFLOW_POSTGRES_SPARE_URL        like the first, for the one test that
#                                      restarts its server mid-run
# The main cluster also has a role `snapflow_pw` with the password
# `snapflow` (scram-sha-256), for the wrong-password test.
# PostgreSQL comes from Debian's packages (`apt-get install postgresql`) when
# it is missing. initdb refuses to run as root, so as root the clusters run
# as the `postgres` user the package creates.
set -euo pipefail

state_file="${SNAPFLOW_PG_STATE:-${TMPDIR:-/tmp}/snapflow-postgres.state}"
port=5432

log() { echo "postgres.sh: $*" >&2; }

bin_dir() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [[ -z "${dir}" || ! -x "${dir}/initdb" ]]; then
    return 1
  fi
  echo "${dir}"
}

install_if_missing() {
  if bin_dir >/dev/null; then
    return
  fi
  if [[ "$(id -u)" != 0 ]]; then
    log "PostgreSQL is not installed; run: sudo apt-get install -y postgresql"
    exit 1
  fi
  log "installing PostgreSQL from Debian's packages"
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql >&2
}

# Runs a command as the clusters' owner.
as_owner() {
  if [[ "$(id -u)" == 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# init_cluster DIR MAX_PREPARED
init_cluster() {
  local data="$1/data" prepared="$2" bin
  bin=$(bin_dir)
  as_owner "${bin}/initdb" -D "${data}" -U postgres --auth-local=trust --auth-host=reject \
    --no-sync -E UTF8 >"$1/initdb.log" 2>&1 || { cat "$1/initdb.log" >&2; exit 1; }
  {
    echo "local all snapflow_pw scram-sha-256"
    echo "local all all trust"
  } | as_owner tee "${data}/pg_hba.conf" >/dev/null
  as_owner "${bin}/pg_ctl" -D "${data}" -l "$1/server.log" -w -t 60 \
    -o "-c listen_addresses='' -k $1 -p ${port} -c max_prepared_transactions=${prepared} -c fsync=off -c max_connections=200" \
    start >&2 || { cat "$1/server.log" >&2; exit 1; }
}

# Whether every cluster under ROOT runs.
running() {
  local cluster
  [[ -d "$1" ]] || return 1
  for cluster in main noprepared spare; do
    as_owner "$(bin_dir)/pg_ctl" -D "$1/${cluster}/data" status >/dev/null 2>&1 || return 1
  done
}

url_of() { echo "host=$1 port=${port} user=postgres dbname=postgres"; }

start() {
  if [[ -f "${state_file}" ]]; then
    local root
    root=$(cat "${state_file}")
    if running "${root}"; then
      log "already running in ${root}"
      print_exports "${root}"
      return
    fi
    # A partial or stale set (an older script, a crash): start afresh.
    stop
  fi
  install_if_missing
  local root
  root=$(mktemp -d "${TMPDIR:-/tmp}/snapflow-pg.XXXXXX")
  chmod 755 "${root}"
  mkdir -p "${root}/main" "${root}/noprepared" "${root}/spare"
  if [[ "$(id -u)" == 0 ]]; then
    chown -R postgres: "${root}"
  fi
  echo "${root}" >"${state_file}"
  init_cluster "${root}/main" 64
  init_cluster "${root}/noprepared" 0
  init_cluster "${root}/spare" 64
  psql "$(url_of "${root}/main")" -q -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE snapflow_pw LOGIN SUPERUSER PASSWORD 'snapflow'" >&2
  log "started in ${root}"
  print_exports "${root}"
}

print_exports() {
  echo "export SNAPFLOW_POSTGRES_URL='$(url_of "$1/main")'"
  echo "export SNAPFLOW_POSTGRES_NO_PREPARED_URL='$(url_of "$1/noprepared")'"
  echo "export SNAPFLOW_POSTGRES_SPARE_URL='$(url_of "$1/spare")'"
}

stop() {
  if [[ ! -f "${state_file}" ]]; then
    log "nothing to stop"
    return
  fi
  local root bin
  root=$(cat "${state_file}")
  bin=$(bin_dir || true)
  for cluster in main noprepared spare; do
    if [[ -n "${bin}" && -d "${root}/${cluster}/data" ]]; then
      as_owner "${bin}/pg_ctl" -D "${root}/${cluster}/data" -m fast -w stop >&2 || true
    fi
  done
  rm -rf "${root}" "${state_file}"
  log "stopped"
}

# restart CLUSTER: a fast shutdown (open connections are cut, prepared
# transactions survive) and a start with the same settings.
restart() {
  local root cluster="${1:-}"
  if [[ ! -f "${state_file}" || ! "${cluster}" =~ ^(main|noprepared|spare)$ ]]; then
    echo "usage: $0 restart main|noprepared|spare (after start)" >&2
    exit 2
  fi
  root=$(cat "${state_file}")
  # The log file keeps the new server off the caller's stdout and stderr,
  # which it would otherwise hold open (and a pipe reading them would
  # never end).
  as_owner "$(bin_dir)/pg_ctl" -D "${root}/${cluster}/data" -l "${root}/${cluster}/server.log" \
    -m fast -w -t 60 restart </dev/null >&2
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) restart "${2:-}" ;;
  *)
    echo "usage: $0 start|stop|restart CLUSTER" >&2
    exit 2
    ;;
esac
