#!/usr/bin/env bash
# session 23 (issue 16): s22b.sh's plan (never run in session 22) plus test_spec's SpecGpu.*
# (session 21's headless spec prefill). binaries (sm_90a only, stripped): ninfer_base = main's
# product (2dc42f4's ninfer.cu), ninfer = 2dc42f4 + the register-A kernel's instruction cuts
# (git diff 2dc42f4 5e1f932 -- ninfer.cu), ninfer_ss = ss-promote (2003b0f, the shared-A
# product); test_kernels, test_gpu and test_spec of ss-promote. make the carry folder with
# pack.sh (.carry-s23), carry it, run bash .carry-s23/s23.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s23}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED' run kern 150 build/test/test_kernels --gtest_filter='Gemm.*'
RUN_GREP='q4|q5|q6|gemm T' RUN_HEAD=14 run gemmv 150 build/test/test_kernels --gtest_filter='Bench.DISABLED_GemmVersions' --gtest_also_run_disabled_tests
models_done
kjv_md5 build/test/ninfer_base build/apps/ninfer build/test/ninfer_ss
bin_of() { case $1 in base) echo build/test/ninfer_base;; ss) echo build/test/ninfer_ss;; *) echo build/apps/ninfer;; esac; }
for b in base rs ss; do b9 9b $b $(bin_of $b) "-p 512,4096 -n 0 -r 3"; done
for b in base rs ss; do b9 4b $b $(bin_of $b) "-p 4096 -n 0 -r 2"; b9 9b $b $(bin_of $b) "-p 4096 -n 0 -r 2 --prefill-chunk 4096"; done
b9 9b base build/test/ninfer_base "-p 0 -n 128 -r 2"
RUN_GREP='FAILED|Failure' run gpu 170 build/test/test_gpu
RUN_GREP='FAILED|Failure' run spec 120 build/test/test_spec --gtest_filter='SpecGpu.*'
echo "total $(( $(date +%s) - t0 )) s"
