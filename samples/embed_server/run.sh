#!/bin/sh
# make run: the embedding server on all-MiniLM-L6-v2 (CUDA where a GPU is
# usable, else the CPU), driven over loopback by the bundled client from
# several connections with real sentences of varying lengths; then SIGTERM,
# and the server must exit 0 after finishing what is in flight.
#   BUILD (default build), MODEL_DIR (default models/all-MiniLM-L6-v2),
#   RUN_REQUESTS (default 600), RUN_CONNECTIONS (default 8)
set -u
B=${BUILD:-build}
MODEL=${MODEL_DIR:-models/all-MiniLM-L6-v2}
N=${RUN_REQUESTS:-600}
C=${RUN_CONNECTIONS:-8}
dir=$(mktemp -d "${TMPDIR:-/tmp}/sj-run.XXXXXX") || exit 1
"$B/samples/embed_server" --model "$MODEL" --port 0 --port-file "$dir/port" 2> "$dir/server.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; rm -rf "$dir"' EXIT
i=0
while [ ! -s "$dir/port" ] && kill -0 $pid 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -s "$dir/port" ]; then
    echo "run: the server did not start:"; cat "$dir/server.log"; exit 1
fi
port=$(cat "$dir/port")
echo "== one sentence a request, $C connections"
"$B/samples/embed_client" --port "$port" --connections "$C" --requests "$N" --batch 1; rc1=$?
echo "== eight sentences a request, 4 connections"
"$B/samples/embed_client" --port "$port" --connections 4 --requests $((N / 8 + 1)) --batch 8; rc2=$?
kill -TERM $pid
wait $pid; rcs=$?
trap 'rm -rf "$dir"' EXIT
echo "== server log"
cat "$dir/server.log"
echo "run: client exit codes $rc1 $rc2, server exit code $rcs"
[ $rc1 = 0 ] && [ $rc2 = 0 ] && [ $rcs = 0 ]
