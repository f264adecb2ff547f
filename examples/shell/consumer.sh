#!/usr/bin/env bash
# Consume TOPIC as consumer group GROUP: ack on success, nack on failure.
#
# Usage: consumer.sh TOPIC GROUP [IDLE_SECONDS]
#
# Long-polls for messages, runs handle on each, acks it when handle succeeds
# and nacks it (retryable, with the failure as the reason) when it fails;
# the broker redelivers after the topic's backoff, or dead-letters after
# max_retry failures. Prints "ok GROUP KEY VALUE" / "nack GROUP KEY REASON".
# The example handler fails the first delivery of every message whose value
# contains "flaky". Stops after IDLE_SECONDS without a message (default:
# runs until interrupted; whole seconds). Needs curl, jq and GNU date.
#
# Environment: MQD_SERVER (default http://127.0.0.1:7070), MQD_TOKEN.
set -euo pipefail
SERVER=${MQD_SERVER:-http://127.0.0.1:7070}
SERVER=${SERVER%/}
auth=()
[ -n "${MQD_TOKEN:-}" ] && auth=(-H "Authorization: Bearer $MQD_TOKEN")
topic=${1:?usage: consumer.sh TOPIC GROUP [IDLE_SECONDS]}
group=${2:?usage: consumer.sh TOPIC GROUP [IDLE_SECONDS]}
idle=${3:-}
WAIT_MS=1000 # long-poll; curl's --max-time must be longer
base="$SERVER/v1/topics/$(jq -rn --arg t "$topic" '$t|@uri')/groups/$(jq -rn --arg g "$group" '$g|@uri')"

call() { # path json → answer body; fails on a non-200 answer
  curl -sS --fail-with-body --max-time $((WAIT_MS / 1000 + 15)) "${auth[@]}" \
    -H 'Content-Type: application/json' -X POST --data-binary "$2" "$base/$1"
}

# handle VALUE RETRY_COUNT: the application's work; a non-zero exit (with a
# reason on stdout) has the message redelivered.
handle() {
  if [[ $1 == *flaky* && $2 == 0 ]]; then
    echo "simulated failure on first delivery"
    return 1
  fi
}

now_ms() { date +%s%3N; }
last=$(now_ms)
while [ -z "$idle" ] || [ $(($(now_ms) - last)) -lt $((idle * 1000)) ]; do
  if ! answer=$(call fetch "{\"max\":10,\"wait_ms\":$WAIT_MS}"); then
    echo "fetch failed, retrying" >&2 # connection trouble, 503 during an election
    sleep 0.5
    continue
  fi
  n=$(jq '.messages | length' <<<"$answer")
  for ((i = 0; i < n; i++)); do
    m=$(jq -c ".messages[$i]" <<<"$answer")
    receipt=$(jq -r .receipt <<<"$m")
    value=$(jq -r .value_b64 <<<"$m" | base64 -d)
    key=$(jq -r 'if (.idempotency_key // "") != "" then .idempotency_key else "\(.partition):\(.offset)" end' <<<"$m")
    if reason=$(handle "$value" "$(jq -r .retry_count <<<"$m")"); then
      status=$(call ack "$(jq -nc --arg r "$receipt" '{receipts:[$r]}')" | jq -r '.results[0].status')
      if [ "$status" = ok ]; then
        echo "ok $group $key $value"
      else
        echo "ack $status $group $key" >&2 # stale: it will come again
      fi
    else
      call nack "$(jq -nc --arg r "$receipt" --arg why "$reason" '{receipts:[$r],reason:$why,retryable:true}')" >/dev/null
      echo "nack $group $key $reason"
    fi
  done
  if [ "$n" -gt 0 ]; then last=$(now_ms); fi # idle counts from the end of the last work
done
