#!/usr/bin/env bash
# Installs what is needed, starts a standalone broker (data in ./danube-data), runs a
# produce/consume demo against it with danube-cli, then keeps the broker running until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
BIN=.venv/bin
LOG=$(mktemp -t danube-broker.XXXXXX.log)

"$BIN/danube-broker" 2> >(tee "$LOG" >&2) &
broker=$!
trap 'kill -TERM $broker 2>/dev/null; wait $broker' INT TERM
# Up to 60 s: a broker compiles its kernels before it is ready when numba's cache is not
# current (bootstrap.sh warmed it, so normally about a second).
for _ in $(seq 600); do
  grep -q "event=broker_ready" "$LOG" && break
  kill -0 $broker 2>/dev/null || { echo "demo: the broker did not start (see above)"; exit 1; }
  sleep 0.1
done

echo "demo: creating topic /default/demo (the first producer creates it; nobody is subscribed yet, so this message goes nowhere)"
"$BIN/danube-cli" produce -t /default/demo -m "topic created"
echo "demo: consuming 10 messages from /default/demo on subscription demo-sub"
"$BIN/danube-cli" consume -t /default/demo -m demo-sub --sub-type exclusive -c 10 &
consumer=$!
sleep 1
echo "demo: producing 10 messages to /default/demo"
"$BIN/danube-cli" produce -t /default/demo -m "hello from Danube for Python" -c 10 -i 100
wait $consumer
echo "demo: done. The broker keeps running on 127.0.0.1:6650 (admin 127.0.0.1:50051); Ctrl-C stops it."
wait $broker
