#!/usr/bin/env bash
# session 20 (issue 16), the final commit's check: the pair and gemm kernel tests, test_gpu, the
# kjv md5. copy this file and common.sh to .carry-s20e/ with bins.tar.xz (ninfer, test_kernels,
# test_gpu: make GPU_ARCH=90) and fixtures.tar.xz, carry it, run bash .carry-s20e/s20e.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s20e}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
RUN_GREP='Failure|FAILED' run kern 100 build/test/test_kernels --gtest_filter='Gemv.PairEqualsTwoProducts:Gemm.*'
models_done
RUN_GREP='FAILED|Failure' run gpu 150 build/test/test_gpu
echo "kjv $(build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum)"
echo "total $(( $(date +%s) - t0 )) s"
