#!/usr/bin/env bash
# One episode of the math task with curl and jq only.   bash examples/math_curl.sh http://127.0.0.1:10086
set -euo pipefail
SERVER=${1:-http://127.0.0.1:10086}
AUTH=()
[ -n "${AGENTJET_SWARM_TOKEN:-}" ] && AUTH=(-H "Authorization: Bearer $AGENTJET_SWARM_TOKEN")
ep=$(curl -sf "${AUTH[@]}" -H 'Content-Type: application/json' \
  -d '{"client_id": "curl-example", "task_id": "math-curl", "task_type": "math"}' "$SERVER/swarm/v1/episodes")
id=$(jq -r .episode_id <<<"$ep"); key=$(jq -r .api_key <<<"$ep"); base=$(jq -r .base_url <<<"$ep")
text=$(curl -sf -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model": "agent", "max_tokens": 24, "messages": [{"role": "user", "content": "What is 3 + 4?"}]}' \
  "$base/chat/completions" | jq -r '.choices[0].message.content')
reward=0; grep -qw 7 <<<"$text" && reward=1
curl -sf -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d "{\"reward\": $reward}" "$SERVER/swarm/v1/episodes/$id/end" | jq -c .
echo "model said: $text (reward $reward)"
