#!/usr/bin/env bash
# Start or stop a local three-node mqd cluster on 127.0.0.1.
#   scripts/cluster.sh start   # nodes on HTTP 7001-7003, Raft 7101-7103, data in ./cluster-data
#   scripts/cluster.sh stop    # SIGTERM all three
#   scripts/cluster.sh status  # GET /v1/cluster from node 1
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${MQD_CLUSTER_DATA:-./cluster-data}
BIN=$DATA/mqd
JOIN=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003

case "${1:-}" in
start)
  mkdir -p "$DATA"
  go build -o "$BIN" ./cmd/mqd
  for i in 1 2 3; do
    "$BIN" --id "n$i" --data-dir "$DATA/n$i" --http-addr "127.0.0.1:700$i" --raft-addr "127.0.0.1:710$i" \
      --bootstrap-expect 3 --join "$JOIN" >"$DATA/n$i.log" 2>&1 &
    echo $! >"$DATA/n$i.pid"
  done
  for _ in $(seq 1 100); do
    if curl -fs http://127.0.0.1:7001/readyz >/dev/null 2>&1; then
      echo "cluster up: http://127.0.0.1:7001 (logs in $DATA/n*.log)"
      exit 0
    fi
    sleep 0.2
  done
  echo "cluster did not become ready; see $DATA/n*.log" >&2
  exit 1
  ;;
stop)
  for i in 1 2 3; do
    [ -f "$DATA/n$i.pid" ] && kill "$(cat "$DATA/n$i.pid")" 2>/dev/null || true
    rm -f "$DATA/n$i.pid"
  done
  ;;
status)
  curl -s http://127.0.0.1:7001/v1/cluster
  echo
  ;;
*)
  echo "usage: $0 start|stop|status" >&2
  exit 2
  ;;
esac
