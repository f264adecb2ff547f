#!/usr/bin/env bash
# A local three-node mqd cluster on 127.0.0.1.
#   scripts/cluster.sh start           # n1..n3 (those not running): HTTP 7001-7003, Raft 7101-7103, data in ./cluster-data
#   scripts/cluster.sh stop [NODE]     # SIGTERM (graceful stop) all three, or NODE (n1, n2, n3); waits for the exit
#   scripts/cluster.sh kill NODE       # SIGKILL NODE: a crash
#   scripts/cluster.sh restart NODE    # stop NODE if it runs, start it again with the same command
#   scripts/cluster.sh status          # GET /v1/cluster from the first running node
# A pid file is trusted only while its process is that node: one whose command
# line holds the node's --data-dir (a stale pid, reused by another process, is
# never signalled).
# Environment: MQD_CLUSTER_DATA (./cluster-data), MQD_CLUSTER_BIN (a prebuilt
# mqd; default: go build into the data dir), MQD_CLUSTER_HTTP_PORTS
# ("7001 7002 7003"), MQD_CLUSTER_RAFT_PORTS ("7101 7102 7103").
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${MQD_CLUSTER_DATA:-./cluster-data}
BIN=${MQD_CLUSTER_BIN:-$DATA/mqd}
read -r -a HTTP <<<"${MQD_CLUSTER_HTTP_PORTS:-7001 7002 7003}"
read -r -a RAFT <<<"${MQD_CLUSTER_RAFT_PORTS:-7101 7102 7103}"
JOIN="127.0.0.1:${HTTP[0]},127.0.0.1:${HTTP[1]},127.0.0.1:${HTTP[2]}"

usage() {
  echo "usage: $0 start | stop [NODE] | kill NODE | restart NODE | status   (NODE: n1, n2 or n3)" >&2
  exit 2
}

# index NODE: 1, 2 or 3 for n1, n2, n3.
index() {
  case "${1:-}" in
  n1 | n2 | n3) echo "${1#n}" ;;
  *) usage ;;
  esac
}

# is_node PID I: PID is a live process running node I (its --data-dir).
is_node() {
  local pid=$1 i=$2 args
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  if [ -r "/proc/$pid/cmdline" ]; then
    args=$(tr '\0' '\n' <"/proc/$pid/cmdline")
  else
    args=$(ps -p "$pid" -o command= | tr ' ' '\n')
  fi
  grep -qxF -- "$DATA/n$i" <<<"$args" && grep -qxF -- "--data-dir" <<<"$args"
}

# pid_of I: node I's pid, if its pid file names a process that is node I;
# a stale pid file is removed (and said so).
pid_of() {
  local i=$1 f="$DATA/n$1.pid" pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  if is_node "$pid" "$i"; then
    echo "$pid"
    return 0
  fi
  echo "n$i: pid file $f named $pid, which is not n$i (exited, or the pid was reused): removed" >&2
  rm -f "$f"
  return 1
}

start_node() {
  local i=$1 pid
  if pid=$(pid_of "$i"); then
    echo "n$i already running (pid $pid)"
    return 0
  fi
  "$BIN" --id "n$i" --data-dir "$DATA/n$i" --http-addr "127.0.0.1:${HTTP[i - 1]}" --raft-addr "127.0.0.1:${RAFT[i - 1]}" \
    --bootstrap-expect 3 --join "$JOIN" >>"$DATA/n$i.log" 2>&1 &
  echo $! >"$DATA/n$i.pid"
  echo "n$i started (pid $!, HTTP 127.0.0.1:${HTTP[i - 1]}, log $DATA/n$i.log)"
}

# signal_node I SIG: send SIG to node I and wait (up to 20 s) for it to exit.
signal_node() {
  local i=$1 sig=$2 pid
  if ! pid=$(pid_of "$i"); then
    echo "n$i is not running"
    return 0
  fi
  kill "-$sig" "$pid"
  for _ in $(seq 1 100); do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$DATA/n$i.pid"
      echo "n$i stopped ($sig, pid $pid)"
      return 0
    fi
    sleep 0.2
  done
  echo "n$i (pid $pid) did not exit within 20 s of $sig" >&2
  return 1
}

wait_ready() {
  local port=$1
  for _ in $(seq 1 150); do
    if curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  return 1
}

case "${1:-}" in
start)
  mkdir -p "$DATA"
  if [ -z "${MQD_CLUSTER_BIN:-}" ]; then
    go build -o "$BIN" ./cmd/mqd
  fi
  for i in 1 2 3; do start_node "$i"; done
  if wait_ready "${HTTP[0]}"; then
    echo "cluster up: http://127.0.0.1:${HTTP[0]} (logs in $DATA/n*.log)"
    exit 0
  fi
  echo "cluster did not become ready; see $DATA/n*.log" >&2
  exit 1
  ;;
stop)
  if [ -n "${2:-}" ]; then
    i=$(index "$2")
    signal_node "$i" TERM
  else
    for i in 1 2 3; do signal_node "$i" TERM; done
  fi
  ;;
kill)
  i=$(index "${2:-}")
  signal_node "$i" KILL
  ;;
restart)
  i=$(index "${2:-}")
  signal_node "$i" TERM
  start_node "$i"
  if ! wait_ready "${HTTP[i - 1]}"; then
    echo "n$i did not become ready; see $DATA/n$i.log" >&2
    exit 1
  fi
  echo "n$i ready"
  ;;
status)
  for i in 1 2 3; do
    if pid_of "$i" >/dev/null 2>&1; then
      curl -s "http://127.0.0.1:${HTTP[i - 1]}/v1/cluster"
      echo
      exit 0
    fi
  done
  echo "no node is running" >&2
  exit 1
  ;;
*)
  usage
  ;;
esac
