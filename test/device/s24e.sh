#!/usr/bin/env bash
# session 24, call 3 (issue 16), NOT RUN (refused: the session's device time was spent). for the
# tree with test/device/tiled.patch applied. s24d.sh could not be placed (four failed starts); what is left
# of the device time takes correctness alone: 1f99563's tiled kernel tests and Gemm.*, test_gpu
# (the loader's tiling end to end against the cpu), the kjv md5. pack into .carry-s24e, carry
# it, run bash .carry-s24e/s24e.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s24e}
unpack
test_models "tiny tiny-gqa1" "groupwise-int bf16"
RUN_GREP='FAILED|Failure' run kern 90 build/test/test_kernels --gtest_filter='Gemv.Tiled*:Gemm.MatchesFloat64:Gemm.WgmmaMatchesFloat64'
kjv_md5 build/apps/ninfer
models_done
RUN_GREP='FAILED|Failure' run gpu 120 build/test/test_gpu
echo "total $(( $(date +%s) - t0 )) s"
