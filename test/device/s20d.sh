#!/usr/bin/env bash
# session 20 (issue 16), fourth call: the wgmma gemm's stage form 4 / 3 (ninfer) against 6 / 4
# (ninfer_base) end to end, and the 9b tg128 of the final binary. copy this file and common.sh to .carry-s20d/ with bins.tar.xz
# (ninfer, ninfer_base: make GPU_ARCH=90) and fixtures.tar.xz, carry it, run bash .carry-s20d/s20d.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s20d}
unpack
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
models_done
for n in 9b 4b; do for b in base new base new; do
  bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  echo "== $n $b $($bin --bench /tmp/$n.ninfer -p 512,4096 -n 0 -r 3 2>&1 | grep '| pp' | tr '\n' ' ')"
done; done
for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  echo "== 9b chunk 4096 $b $($bin --bench /tmp/9b.ninfer -p 4096 -n 0 -r 3 --prefill-chunk 4096 2>&1 | grep '| pp')"; done
echo "== 9b tg128 new $(build/apps/ninfer --bench /tmp/9b.ninfer -p 0 -n 128 -r 3 2>&1 | grep '| tg')"
echo "== kjv demo, new / base (greedy md5)"
for bin in build/apps/ninfer build/test/ninfer_base; do $bin models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum; done
echo "total $(( $(date +%s) - t0 )) s"
