#!/usr/bin/env bash
# session 21 (issue 16), third call: gemm_swiglu's epilogue as a template parameter (the plain
# wgmma kernel as before), the head skipped on a prompt's pieces before its last. kernel tests,
# test_gpu, the kjv md5 (default chunk and --prefill-chunk 16: pieces without a head); ninfer-
# bench base (d2fc0cc, build/test/ninfer_base) / new alternating: 9b, 4b, 0.8b. copy this file
# and common.sh to .carry-s21c/ with bins.tar.xz (ninfer, ninfer_base, test_kernels, test_gpu:
# make GPU_ARCH=90) and fixtures.tar.xz, carry it, run bash .carry-s21c/s21c.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s21c}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b 0.8b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED|differ' run kern 150 build/test/test_kernels --gtest_filter='Gemm.*:Norms.*:Gdn.ConvPrefill:Gemv.GatedNormPrepEqualsTheKernels'
models_done
RUN_GREP='FAILED|Failure' run gpu 200 build/test/test_gpu
P="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel"
for b in build/apps/ninfer build/test/ninfer_base; do for c in 1024 16; do
  echo "kjv $b chunk $c $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c 2>/dev/null | md5sum)"; done; done
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s;", $5, $6}')"; }
for r in 1 2; do
  b9 9b base build/test/ninfer_base "-p 512,4096 -n 0 -r 3"
  b9 9b new build/apps/ninfer "-p 512,4096 -n 0 -r 3"
done
b9 9b chunk4096-base build/test/ninfer_base "-p 4096 -n 0 -r 3 --prefill-chunk 4096"
b9 9b chunk4096-new build/apps/ninfer "-p 4096 -n 0 -r 3 --prefill-chunk 4096"
for n in 4b 0.8b; do for b in base new; do
  bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 $n $b $bin "-p 512,4096 -n 128 -r 3"; done; done
b9 9b new build/apps/ninfer "-p 0 -n 128 -r 3"
echo "total $(( $(date +%s) - t0 )) s"
