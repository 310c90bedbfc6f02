# Sourced by the scripts that start a throw-away server (.ci/kafka.sh,
# .ci/s3.sh): stopping one from its state file. It starts nothing and
# knows no server; each script keeps its own start.

# stop_daemon STATE_FILE DIR_PREFIX: reads the pid (line 1) and the
# working directory (line 2) from STATE_FILE, stops the process (TERM,
# then KILL after 5 s), removes the directory only if it is under
# DIR_PREFIX (a temporary directory this script made), and the state file.
stop_daemon() {
  local state_file=$1 prefix=$2
  if [[ ! -f "${state_file}" ]]; then
    log "nothing to stop"
    return
  fi
  local pid dir
  pid=$(sed -n 1p "${state_file}")
  dir=$(sed -n 2p "${state_file}")
  if kill -0 "${pid}" 2>/dev/null; then
    kill "${pid}" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "${pid}" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "${pid}" 2>/dev/null || true
  fi
  if [[ -n "${dir}" && "${dir}" == "${prefix}".* ]]; then
    rm -rf "${dir}"
  fi
  rm -f "${state_file}"
  log "stopped"
}
