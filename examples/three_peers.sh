#!/usr/bin/env bash
# Three peers as separate processes on loopback, crawling the generated test web.
# Open the status pages printed below in a browser; Ctrl-C stops everything.
set -euo pipefail
work=$(mktemp -d)
python -m p2pcrawl.testing.serve --hosts 6 --pages 100 > "$work/web.json" &
web_pid=$!
pids=("$web_pid")
trap 'kill "${pids[@]}" 2>/dev/null; wait; rm -rf "$work"' EXIT
until [ -s "$work/web.json" ]; do sleep 0.2; done
hub=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["hub"])' "$work/web.json")
domains=$(python -c 'import json,sys; print(" ".join("--allow-domain " + d for d in json.load(open(sys.argv[1]))["allow_domains"]))' "$work/web.json")
common="--allow-private --delay 0.05 --politeness-factor 0 $domains"

# shellcheck disable=SC2086
p2pcrawl join --listen 127.0.0.1:9100 --status 127.0.0.1:8180 --data "$work/a" $common &
pids+=($!)
sleep 2
for i in 1 2; do
  # shellcheck disable=SC2086
  p2pcrawl join --bootstrap 127.0.0.1:9100 --listen 127.0.0.1:$((9100 + i)) \
    --status 127.0.0.1:$((8180 + i)) --data "$work/p$i" $common &
  pids+=($!)
done
sleep 3
p2pcrawl seed --peer 127.0.0.1:8180 "$hub"
echo "status pages: http://127.0.0.1:8180/ http://127.0.0.1:8181/ http://127.0.0.1:8182/"
while sleep 3; do p2pcrawl status --peer 127.0.0.1:8180 | grep -E 'queued|fetched'; done
