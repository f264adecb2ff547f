#!/usr/bin/env bash
# Publish COUNT messages to TOPIC, each with its own idempotency key.
#
# Usage: producer.sh TOPIC COUNT [KEY_PREFIX]
#
# Message i has the key KEY_PREFIX-i and the value "order KEY_PREFIX-i";
# running it twice with the same prefix stores nothing new (duplicate=true).
# A publish that fails on the way (connection error, 503 while a leader is
# elected, 429) is retried with the same key, so a retry never stores the
# message twice. Needs curl and jq.
#
# Environment: MQD_SERVER (default http://127.0.0.1:7070), MQD_TOKEN.
set -euo pipefail
SERVER=${MQD_SERVER:-http://127.0.0.1:7070}
SERVER=${SERVER%/}
auth=()
[ -n "${MQD_TOKEN:-}" ] && auth=(-H "Authorization: Bearer $MQD_TOKEN")
topic=${1:?usage: producer.sh TOPIC COUNT [KEY_PREFIX]}
count=${2:?usage: producer.sh TOPIC COUNT [KEY_PREFIX]}
prefix=${3:-sh}

publish() { # key value → prints the answer; retries with the same key
  local key=$1 value=$2 attempt=0 out code
  while :; do
    out=$(curl -sS --max-time 15 -w '\n%{http_code}' -X POST "${auth[@]}" \
      -H "Idempotency-Key: $key" --data-binary "$value" \
      "$SERVER/v1/topics/$(jq -rn --arg t "$topic" '$t|@uri')/messages") || out=$'\n000'
    code=${out##*$'\n'}
    case $code in
      2??) printf '%s\n' "${out%$'\n'*}"; return 0 ;;
      000|429|502|503|504) ;;            # transport error or retryable status
      *) echo "publish $key: $code ${out%$'\n'*}" >&2; return 1 ;;
    esac
    attempt=$((attempt + 1))
    if [ "$attempt" -ge 8 ]; then echo "publish $key: gave up ($code)" >&2; return 1; fi
    sleep "$(awk -v a="$attempt" 'BEGIN { d = 0.1 * 2 ^ (a - 1); print (d > 2 ? 2 : d) }')"
  done
}

for ((i = 0; i < count; i++)); do
  key="$prefix-$i"
  publish "$key" "order $key" | jq -r --arg k "$key" '"published \($k) partition=\(.partition) offset=\(.offset) duplicate=\(.duplicate)"'
done
