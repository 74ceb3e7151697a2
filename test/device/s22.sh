#!/usr/bin/env bash
# session 22 (issue 16): the wgmma gemm's instruction count. binaries (make GPU_ARCH=90,
# stripped: the carry limit): ninfer_base = 85baff1 (session 21's); ninfer and the tests =
# 840b60b + the test changes after it (a stage's descriptor as its low word plus an offset, the
# mbarrier and x-copy addresses computed once a block, q4's mask and magic in one lop3, q5's
# high bits by rotations). test_kernels Gemm.* (the float64 check; the barrier version, the
# shared-A version gemm_wgmma_ss_kernel and the stage forms memcmp-equal to the product; the
# swiglu epilogue) and Bench.DISABLED_GemmVersions; test_gpu (with the headless pieces' test);
# the kjv md5 of both binaries, plain and with --spec mtp, at --prefill-chunk 1024 and 16;
# ninfer-bench of both alternating. copy this file and common.sh to .carry-s22/ with
# bins.tar.xz and fixtures.tar.xz, carry it, run bash .carry-s22/s22.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s22}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED' run kern 150 build/test/test_kernels --gtest_filter='Gemm.*'
RUN_GREP='q4|q5|q6|gemm T' RUN_HEAD=12 run gemmv 150 build/test/test_kernels --gtest_filter='Bench.DISABLED_GemmVersions' --gtest_also_run_disabled_tests
models_done
P="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel"
for b in build/test/ninfer_base build/apps/ninfer; do for c in 1024 16; do
  echo "kjv $b chunk $c $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c 2>/dev/null | md5sum)"
  echo "kjv $b chunk $c spec $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c --spec mtp --draft-tokens 3 2>/dev/null | md5sum)"; done; done
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s %s;", $5, $6, $9}')"; }
bin_of() { [ $1 = base ] && echo build/test/ninfer_base || echo build/apps/ninfer; }
for r in 1 2; do for b in base new; do b9 9b $b $(bin_of $b) "-p 512,4096 -n 0 -r 3"; done; done
for b in base new; do b9 4b $b $(bin_of $b) "-p 4096 -n 0 -r 2"; b9 9b $b $(bin_of $b) "-p 4096 -n 0 -r 2 --prefill-chunk 4096"; done
b9 9b new build/apps/ninfer "-p 0 -n 128 -r 3"
RUN_GREP='FAILED|Failure' run gpu 200 build/test/test_gpu
echo "total $(( $(date +%s) - t0 )) s"
