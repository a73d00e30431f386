#!/bin/sh
# Runs test programs for `make test`: tests/run.sh JOBS PROGRAM...
#
# JOBS = 1: one after another. JOBS > 1: that many at once. Each program's
# output is kept in a file and printed whole, in the order given (so put
# the slow ones first). Exits 1 when any program failed, naming them.
#
# Every program runs under a time limit (SJ_TEST_TIMEOUT seconds, default
# 600; TERM, then KILL 10 s later): a hung test fails with status 124 and
# its name instead of stalling the suite.
#
# One failure is not the test's: LeakSanitizer's stop-the-world tracer
# itself crashing at exit ("Tracer caught signal 11" followed by
# "LeakSanitizer has encountered a fatal error", google/sanitizers#1353),
# after every test case passed. The sanitizer, not the program, failed, and
# no leak report was made; such a program is run once more, visibly, and
# its second verdict is the one that counts. Any other failure counts at
# once.

# Each program's TEST line gives its elapsed seconds (both runs, for a
# rerun), so every log shows where the suite's time goes.

# tests/run.sh --one PROGRAM OUT [ARG...]: run PROGRAM (with the ARGs),
# output in OUT.log, status in OUT.rc, elapsed whole seconds in OUT.secs
# (make test runs the samples this way too).
if [ "$1" = "--one" ]; then
    t=$2 out=$3
    shift 3
    t0=$(date +%s)
    $SJ_RUN "$t" "$@" > "$out.log" 2>&1; rc=$?
    if [ $rc != 0 ] && grep -q "^Tracer caught signal" "$out.log" &&
       grep -q "LeakSanitizer has encountered a fatal error" "$out.log"; then
        mv "$out.log" "$out.first.log"
        $SJ_RUN "$t" "$@" > "$out.log" 2>&1; rc=$?
        { echo "  RERUN   $(basename "$t"): LeakSanitizer's tracer crashed at exit on the first run (a sanitizer failure, not a test's); its output was:"
          sed 's/^/    | /' "$out.first.log" | tail -n 8
          echo "  second run:"; cat "$out.log"; } > "$out.both.log"
        mv "$out.both.log" "$out.log"
    fi
    echo $(( $(date +%s) - t0 )) > "$out.secs"
    echo $rc > "$out.rc"
    exit 0
fi

jobs=${1:-1}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
limit=${SJ_TEST_TIMEOUT:-600}
run="timeout -k 10 $limit"
command -v timeout >/dev/null 2>&1 || run=
shift
self=$0
failed=""
dir=$(mktemp -d "${TMPDIR:-/tmp}/sj-tests.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
report() {
    t=$1 out="$dir/$(basename "$1")"
    secs=$(cat "$out.secs" 2>/dev/null || echo "?")
    printf '  TEST    %s (%s s)\n' "$(basename "$t")" "$secs"
    cat "$out.log" 2>/dev/null
    rc=$(cat "$out.rc" 2>/dev/null || echo "did not run")
    [ "$rc" = 124 ] && echo "  TIMEOUT $t (over $limit s)"
    [ "$rc" = 0 ] || { failed="$failed $t"; echo "  FAIL    $t (exit status $rc)"; }
}
if [ "$jobs" -le 1 ]; then
    for t in "$@"; do
        SJ_RUN="$run" sh "$self" --one "$t" "$dir/$(basename "$t")"
        report "$t"
    done
else
    printf '%s\n' "$@" | SJ_RUN="$run" xargs -P "$jobs" -I{} sh -c \
        'sh "$0" --one "$1" "$2/$(basename "$1")"' "$self" {} "$dir"
    for t in "$@"; do report "$t"; done
fi
if [ -n "$failed" ]; then
    echo "failed:$failed"
    exit 1
fi
