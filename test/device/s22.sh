#!/usr/bin/env bash
# session 22 (issue 16), first call: the wgmma gemm's descriptors as a stage's low word plus an
# offset and its mbarrier addresses computed once (Gemm.*: the float64 check, the dev barrier
# version and stage forms memcmp-equal, the swiglu epilogue); test_gpu (with the headless pieces'
# bit-identity test), test_spec's SpecGpu.* (the headless spec prefill), the kjv md5;
# ninfer-bench against 85baff1's binary (build/test/ninfer_base), alternating. copy this file and
# common.sh to .carry-s22/ with bins.tar.xz (ninfer, ninfer_base, test_kernels, test_gpu,
# test_spec: make GPU_ARCH=90) and fixtures.tar.xz, carry it, run bash .carry-s22/s22.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s22}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED' run kern 150 build/test/test_kernels --gtest_filter='Gemm.*'
models_done
RUN_GREP='FAILED|Failure' run gpu 200 build/test/test_gpu
RUN_GREP='FAILED|Failure' run spec 200 build/test/test_spec --gtest_filter='SpecGpu.*'
P="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel"
for b in build/test/ninfer_base build/apps/ninfer; do for c in 1024 16; do
  echo "kjv $b chunk $c $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c 2>/dev/null | md5sum)"; done; done
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s %s;", $5, $6, $9}')"; }
for r in 1 2; do for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 9b $b $bin "-p 512,4096 -n 0 -r 3"; done; done
for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 4b $b $bin "-p 4096 -n 0 -r 2"; b9 9b $b $bin "-p 4096 -n 0 -r 2 --prefill-chunk 4096"; done
b9 9b new build/apps/ninfer "-p 0 -n 128 -r 3"
echo "total $(( $(date +%s) - t0 )) s"
