#!/bin/sh
# The layering rule of ARCHITECTURE.md, checked: a file never includes a
# header of a higher floor. Floors, bottom up:
#   0 base/   1 shapes/   2 jit/ir/   3 guards/   4 specialize/
#   5 kernels/ (and kernels/cpu/, kernels/cuda/)   6 jit/
# jit/shapejit.h, the public header, includes nothing and may be included
# from anywhere. One more rule inside the floors: a header of kernels/ (the
# device table, a device's interfaces) never includes a header of
# specialize/: a device owns its compiler's options (the CUDA backend's
# NVRTC options: kernels/cuda/nvrtc.h) and depends on the code generator
# only inside its .c files, for what the generator defines (the launch rule
# of a group, the layout of a unit it splits). tests/layers_known.txt lists the upward includes not yet
# removed (the ratchet: each line is debt; a new upward include fails;
# lines starting with # are comments).
# Usage: sh tests/check_layers.sh [--list]
cd "$(dirname "$0")/.." || exit 1
floor() {
    case "$1" in
    base/*) echo 0 ;; shapes/*) echo 1 ;; jit/ir/*) echo 2 ;; guards/*) echo 3 ;;
    specialize/*) echo 4 ;; kernels/*) echo 5 ;; jit/*) echo 6 ;; *) echo -1 ;;
    esac
}
found=$(mktemp) || exit 1
known=$(mktemp) || exit 1
trap 'rm -f "$found" "$known"' EXIT
grep -v -e '^#' -e '^$' tests/layers_known.txt | sort > "$known"
for f in $(git ls-files 'base/*' 'shapes/*' 'jit/*' 'guards/*' 'specialize/*' 'kernels/*' | grep -E '\.(c|h|cu|cuh)$'); do
    ff=$(floor "$f")
    grep -o '^#include "[^"]*"' "$f" | sed 's/^#include "//; s/"$//' | while read -r inc; do
        [ "$inc" = jit/shapejit.h ] && continue
        fi=$(floor "$inc")
        if [ "$fi" -gt "$ff" ]; then echo "$f -> $inc"
        else case "$f:$inc" in kernels/*.h:specialize/*) echo "$f -> $inc" ;; esac; fi
    done
done | sort > "$found"
if [ "${1:-}" = --list ]; then cat "$found"; exit 0; fi
new=$(comm -23 "$found" "$known")
gone=$(comm -13 "$found" "$known")
if [ -n "$gone" ]; then
    echo "layers: no longer upward (remove from tests/layers_known.txt):"; echo "$gone"
fi
if [ -n "$new" ]; then
    echo "layers: new includes from a lower floor to a higher one (or from a header of kernels/ to specialize/):"
    echo "$new"; exit 1
fi
echo "  OK      layers: no new upward include ($(wc -l < "$known") known, listed in tests/layers_known.txt)"
