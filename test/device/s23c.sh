#!/usr/bin/env bash
# session 23, call 3 (issue 16): the wgmma gemm's x stages by tma (one cp.async.bulk.tensor a
# group from a tensor map of x, in place of 8 cp.async a thread) against the shared-A kernel with
# cp.async (ninfer_base: 9beae0c's). binaries: ninfer, test_kernels, test_gpu of the tma tree,
# ninfer_base. Gemm.* (the float64 check, the register-A versions memcmp-equal to the product,
# the swiglu epilogue), Bench.DISABLED_GemmVersions, the kjv md5 of both (plain and --spec mtp,
# --prefill-chunk 1024 and 16), the 9b / 4b prefill of both, test_gpu.
# make the carry folder with pack.sh (.carry-s23c), carry it, run bash .carry-s23c/s23c.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s23c}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED' run kern 150 build/test/test_kernels --gtest_filter='Gemm.*'
RUN_GREP='q4|q5|q6|gemm T' RUN_HEAD=14 run gemmv 150 build/test/test_kernels --gtest_filter='Bench.DISABLED_GemmVersions' --gtest_also_run_disabled_tests
models_done
kjv_md5 build/test/ninfer_base build/apps/ninfer
for r in 1 2; do for b in base tma; do B=build/apps/ninfer; [ $b = base ] && B=build/test/ninfer_base
  b9 9b $b $B "-p 512,4096 -n 0 -r 3"; b9 9b $b $B "-p 4096 -n 0 -r 2 --prefill-chunk 4096"; b9 4b $b $B "-p 4096 -n 0 -r 2"; done; done
RUN_GREP='FAILED|Failure' run gpu 170 build/test/test_gpu
echo "total $(( $(date +%s) - t0 )) s"
