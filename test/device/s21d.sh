#!/usr/bin/env bash
# session 21 (issue 16), fourth call: the 27b (pp4096, tg128) and the 9b pp4096 of s21c's
# binaries against d2fc0cc's (build/test/ninfer_base), on whichever card the call gets. carry
# .carry-s21c/ (s21c.sh's folder) with this file in it, run bash .carry-s21c/s21d.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s21c}
unpack
for n in 9b 27b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 16 > $OUT/convert_$n.log 2>&1 & done
models_done
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s;", $5, $6}')"; }
for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 9b $b $bin "-p 4096 -n 0 -r 3"; done
for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 27b $b $bin "-p 4096 -n 128 -r 2"; done
echo "total $(( $(date +%s) - t0 )) s"
