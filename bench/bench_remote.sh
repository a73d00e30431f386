#!/usr/bin/env bash
# Cold starts of N server-like processes (build/bench/bench_coldstart: w1-w3
# at four lengths, 12 compile units), each with an empty disk cache, three
# ways:
#   local        no remote cache: every process compiles everything
#   shared-cold  one Redis shared by all, started together on an empty Redis
#                (a fleet rolled out at once: they race, each misses what the
#                others have not pushed yet)
#   shared-warm  the same Redis after one process has filled it (a fleet that
#                grows, or restarts after a first machine warmed it)
# and prints, per N and way, one JSON line: compiler runs in all, cold-start
# time (mean and slowest process), and the Redis traffic per cold start
# (redis INFO: total_net_input_bytes + total_net_output_bytes).
#
#   make build/bench/bench_coldstart && bash bench/bench_remote.sh [N ...]   (default 1 2 4)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bench/bench_coldstart}
[ -x "$BIN" ] || { echo "bench_remote: $BIN missing (make $BIN)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "bench_remote: no redis-server (apt-get install redis-server)" >&2; exit 1; }
NS=${*:-1 2 4}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sj-bench-remote.XXXXXX")
sock=$tmp/redis.sock
redis-server --port 0 --unixsocket "$sock" --unixsocketperm 700 --save "" --appendonly no \
  --dir "$tmp" --logfile "$tmp/redis.log" --daemonize no &
rpid=$!
trap 'kill $rpid 2>/dev/null; wait $rpid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do redis-cli -s "$sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
export SHAPEJIT_CACHE_KEY=bench-remote-key SHAPEJIT_LOG=warn
net() { redis-cli -s "$sock" info stats | awk -F: '/^total_net_(input|output)_bytes/ {s += $2} END {print s}'; }
run_one() { # $1: output file, $2: cache dir, $3: remote URL or ""
  SHAPEJIT_CACHE_DIR=$2 SHAPEJIT_REMOTE_CACHE_URL=$3 "$BIN" > "$1"
}
# N processes at once; their JSON lines to $tmp/out.*
run_n() { # $1: N, $2: URL or "", $3: tag
  local pids=() i
  for i in $(seq "$1"); do run_one "$tmp/out.$3.$i" "$tmp/cache.$3.$i" "$2" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p"; done
}
summary() { # $1: N, $2: way, $3: tag, $4: redis bytes
  cat "$tmp"/out."$3".* | awk -v n="$1" -v way="$2" -v bytes="$4" -F'[:,}]' '
    { for (i = 1; i < NF; i++) { if ($i ~ /"ms"/) ms = $(i+1); if ($i ~ /"compiler_runs"/) cr = $(i+1);
        if ($i ~ /"remote_hits"/) rh = $(i+1); if ($i ~ /"compiles"/) c = $(i+1); if ($i ~ /"bad"/) bad += $(i+1) }
      sum += ms; if (ms > max) max = ms; runs += cr; hits += rh; comp += c; k++ }
    END { f = "{\"bench\":\"remote\",\"n\":%d,\"way\":\"%s\",\"compiles\":%d,\"compiler_runs\":%d,\"remote_hits\":%d,";
          f = f "\"cold_start_ms_mean\":%.0f,\"cold_start_ms_max\":%.0f,\"redis_bytes_per_start\":%.0f,\"bad\":%d}\n";
          printf f, n, way, comp, runs, hits, sum / k, max, bytes / n, bad }'
}
url=unix://$sock
for n in $NS; do
  rm -rf "$tmp"/cache.* "$tmp"/out.*
  run_n "$n" "" local
  summary "$n" local local 0
  redis-cli -s "$sock" flushall >/dev/null
  b0=$(net); run_n "$n" "$url" cold; b1=$(net)
  summary "$n" shared-cold cold $((b1 - b0))
  redis-cli -s "$sock" flushall >/dev/null
  run_one "$tmp/warmup.out" "$tmp/cache.warmup" "$url"
  b0=$(net); run_n "$n" "$url" warm; b1=$(net)
  summary "$n" shared-warm warm $((b1 - b0))
done
echo "{\"bench\":\"remote\",\"redis_entries\":$(redis-cli -s "$sock" dbsize),\"redis_used_memory\":$(redis-cli -s "$sock" info memory | awk -F: '/^used_memory:/ {print $2+0}')}"
