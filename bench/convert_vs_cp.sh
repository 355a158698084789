#!/usr/bin/env bash
# A/B of `portable-ckpt convert` against `cp -r` of the same source, run alternately, each
# command starting from a clean page-cache state (dirty pages flushed, source read once).
# Usage: bench/convert_vs_cp.sh SRC_DIR [REPS]   (prints one line per repetition)
set -euo pipefail
SRC=$1; REPS=${2:-5}; WORK=$(mktemp -d "${TMPDIR:-/tmp}/pck-cvcp.XXXXXX")
PCK=${PCK:-$(dirname "$0")/../.venv/bin/portable-ckpt}
trap 'rm -rf "$WORK"' EXIT
for r in $(seq "$REPS"); do
  rm -rf "$WORK/cp" "$WORK/cv"; sync; cat "$SRC"/* > /dev/null
  t0=$(date +%s.%N); cp -r "$SRC" "$WORK/cp"; t1=$(date +%s.%N); sync -f "$WORK/cp"; t2=$(date +%s.%N)
  rm -rf "$WORK/cp"; sync; cat "$SRC"/* > /dev/null
  t3=$(date +%s.%N); "$PCK" convert "$SRC" "$WORK/cv" --trust-pickle --json > /dev/null; t4=$(date +%s.%N)
  python3 -c "cp=$t1-$t0; cps=$t2-$t0; cv=$t4-$t3; print(f'cp {cp:.2f} s  cp+sync {cps:.2f} s  convert {cv:.2f} s  convert vs cp {cp/cv:.2f}x  vs cp+sync {cps/cv:.2f}x')"
done
