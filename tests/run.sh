#!/bin/sh
# Runs test programs for `make test`: tests/run.sh JOBS PROGRAM...
#
# JOBS = 1: one after another, output as it comes. JOBS > 1: that many at
# once, each program's output kept in a file and printed whole, in the
# order given, once all have ended (so put the slow ones first). Exits 1
# when any program failed, naming them.
jobs=${1:-1}
shift
failed=""
if [ "$jobs" -le 1 ]; then
    for t in "$@"; do
        printf '  TEST    %s\n' "$(basename "$t")"
        "$t" || { failed="$failed $t"; echo "  FAIL    $t"; }
    done
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/sj-tests.XXXXXX") || exit 1
    trap 'rm -rf "$dir"' EXIT
    printf '%s\n' "$@" | SJ_RUN_DIR="$dir" xargs -P "$jobs" -I{} sh -c \
        'out="$SJ_RUN_DIR/$(basename "$1")"; "$1" > "$out.log" 2>&1; echo $? > "$out.rc"' sh {}
    for t in "$@"; do
        out="$dir/$(basename "$t")"
        printf '  TEST    %s\n' "$(basename "$t")"
        cat "$out.log" 2>/dev/null
        rc=$(cat "$out.rc" 2>/dev/null || echo "did not run")
        [ "$rc" = 0 ] || { failed="$failed $t"; echo "  FAIL    $t (exit status $rc)"; }
    done
fi
if [ -n "$failed" ]; then
    echo "failed:$failed"
    exit 1
fi
