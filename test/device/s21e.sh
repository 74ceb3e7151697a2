#!/usr/bin/env bash
# session 21 (issue 16), fifth call: the wgmma gemm's descriptors as a stage's low word plus an
# offset (one uniform add a wgmma). kernel tests (Gemm.*: the float64 check, the dev barrier
# version and stage forms memcmp-equal, the swiglu epilogue), test_gpu, the kjv md5;
# ninfer-bench against 85baff1's binary (build/test/ninfer_base), alternating. copy this file
# and common.sh to .carry-s21e/ with bins.tar.xz (ninfer, ninfer_base, test_kernels, test_gpu:
# make GPU_ARCH=90) and fixtures.tar.xz, carry it, run bash .carry-s21e/s21e.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s21e}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED' run kern 150 build/test/test_kernels --gtest_filter='Gemm.*'
models_done
RUN_GREP='FAILED|Failure' run gpu 200 build/test/test_gpu
P="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel"
echo "kjv $(build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 2>/dev/null | md5sum)"
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s;", $5, $6}')"; }
for r in 1 2; do for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 9b $b $bin "-p 512,4096 -n 0 -r 3"; done; done
for n in 4b; do for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 $n $b $bin "-p 4096 -n 0 -r 2"; done; done
echo "total $(( $(date +%s) - t0 )) s"
