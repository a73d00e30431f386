#!/bin/sh
# Runs test programs for `make test`: tests/run.sh JOBS PROGRAM...
#
# JOBS = 1: one after another, output as it comes. JOBS > 1: that many at
# once, each program's output kept in a file and printed whole, in the
# order given, once all have ended (so put the slow ones first). Exits 1
# when any program failed, naming them.
#
# Every program runs under a time limit (SJ_TEST_TIMEOUT seconds, default
# 600; TERM, then KILL 10 s later): a hung test fails with status 124 and
# its name instead of stalling the suite.
jobs=${1:-1}
limit=${SJ_TEST_TIMEOUT:-600}
run="timeout -k 10 $limit"
command -v timeout >/dev/null 2>&1 || run=
shift
failed=""
if [ "$jobs" -le 1 ]; then
    for t in "$@"; do
        printf '  TEST    %s\n' "$(basename "$t")"
        $run "$t"; rc=$?
        [ $rc = 124 ] && echo "  TIMEOUT $t (over $limit s)"
        [ $rc = 0 ] || { failed="$failed $t"; echo "  FAIL    $t (exit status $rc)"; }
    done
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/sj-tests.XXXXXX") || exit 1
    trap 'rm -rf "$dir"' EXIT
    printf '%s\n' "$@" | SJ_RUN_DIR="$dir" SJ_RUN="$run" xargs -P "$jobs" -I{} sh -c \
        'out="$SJ_RUN_DIR/$(basename "$1")"; $SJ_RUN "$1" > "$out.log" 2>&1; echo $? > "$out.rc"' sh {}
    for t in "$@"; do
        out="$dir/$(basename "$t")"
        printf '  TEST    %s\n' "$(basename "$t")"
        cat "$out.log" 2>/dev/null
        rc=$(cat "$out.rc" 2>/dev/null || echo "did not run")
        [ "$rc" = 124 ] && echo "  TIMEOUT $t (over $limit s)"
        [ "$rc" = 0 ] || { failed="$failed $t"; echo "  FAIL    $t (exit status $rc)"; }
    done
fi
if [ -n "$failed" ]; then
    echo "failed:$failed"
    exit 1
fi
