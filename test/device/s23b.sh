#!/usr/bin/env bash
# session 23, call 2 (issue 16): the decode mlp in one launch (test/dev_kernels.cuh,
# mlp_fused_kernel: gate_up, down's prep and down as phases of one grid with two grid barriers)
# against the product's four launches, and the tree it was built in (ninfer.cu: gemv_xp_block's
# wait and gemv_xprep_block, refactors with the same sass for every gemv kernel). binaries of
# that tree: ninfer, test_kernels, test_gpu. Gemv.* and Gemm.* (Gemv.MlpFusedEqualsTheProducts:
# memcmp against the product), Bench.DISABLED_MlpFused, the kjv md5, 9b pp4096 / tg128, test_gpu.
# make the carry folder with pack.sh (.carry-s23b), carry it, run bash .carry-s23b/s23b.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s23b}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
model_9b
RUN_GREP='Failure|FAILED|differ' run kern 200 build/test/test_kernels --gtest_filter='Gemv.*:Gemm.*'
RUN_GREP='mlp|one launch|product|chain' RUN_HEAD=20 run mlp 150 build/test/test_kernels --gtest_filter='Bench.DISABLED_MlpFused' --gtest_also_run_disabled_tests
models_done
kjv_md5 build/apps/ninfer
b9 9b "" build/apps/ninfer "-p 4096 -n 128 -r 2"
RUN_GREP='FAILED|Failure' run gpu 170 build/test/test_gpu
echo "total $(( $(date +%s) - t0 )) s"
