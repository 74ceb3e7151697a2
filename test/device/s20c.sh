#!/usr/bin/env bash
# session 20 (issue 16), third call: the wgmma gemm's versions (the barrier kernel, stage
# forms) checked and timed. copy this file and common.sh to .carry-s20c/ with bins.tar.xz
# (test_kernels: make GPU_ARCH=90) and fixtures.tar.xz, carry it, run bash .carry-s20c/s20c.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s20c}
unpack
RUN_GREP='Failure|FAILED|differ|ahead|version' run kern 200 build/test/test_kernels --gtest_filter='Gemm.WgmmaVersionsAgree'
run bench 300 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemmVersions'
grep -E 'gemm T=|product|x4096|x12288' $OUT/bench.log | head -20
echo "total $(( $(date +%s) - t0 )) s"
