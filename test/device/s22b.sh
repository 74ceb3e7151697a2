#!/usr/bin/env bash
# session 22 (issue 16): the wgmma gemm with A decoded once into shared memory for a 64 x 256
# tile (branch ss-promote: the product's gemm_wgmma_kernel; the register-A kernel of 840b60b as
# test/dev_kernels.cuh's gemm_wgmma_rs_kernel). binaries (sm_90a only, stripped: the carry
# limit): ninfer_base = 85baff1 (session 21's), ninfer = 840b60b (the register-A kernel with
# this session's instruction cuts), ninfer_ss = ss-promote; test_kernels and test_gpu of
# ss-promote. Gemm.* (the float64 check of the shared-A product, the register-A kernel at its
# stage forms and its barrier version memcmp-equal to it, the swiglu epilogue),
# Bench.DISABLED_GemmVersions, the kjv md5 of the three (plain and --spec mtp, --prefill-chunk
# 1024 and 16), ninfer-bench of the three, test_gpu last. copy this file and common.sh to
# .carry-s22b/ with bins.tar.xz and fixtures.tar.xz, carry it, run bash .carry-s22b/s22b.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s22b}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED' run kern 150 build/test/test_kernels --gtest_filter='Gemm.*'
RUN_GREP='q4|q5|q6|gemm T' RUN_HEAD=12 run gemmv 150 build/test/test_kernels --gtest_filter='Bench.DISABLED_GemmVersions' --gtest_also_run_disabled_tests
models_done
P="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel"
for b in build/test/ninfer_base build/apps/ninfer build/test/ninfer_ss; do for c in 1024 16; do
  echo "kjv $b chunk $c $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c 2>/dev/null | md5sum)"
  echo "kjv $b chunk $c spec $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c --spec mtp --draft-tokens 3 2>/dev/null | md5sum)"; done; done
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s %s;", $5, $6, $9}')"; }
bin_of() { case $1 in base) echo build/test/ninfer_base;; ss) echo build/test/ninfer_ss;; *) echo build/apps/ninfer;; esac; }
for b in base rs ss; do b9 9b $b $(bin_of $b) "-p 512,4096 -n 0 -r 3"; done
for b in base rs ss; do b9 4b $b $(bin_of $b) "-p 4096 -n 0 -r 2"; b9 9b $b $(bin_of $b) "-p 4096 -n 0 -r 2 --prefill-chunk 4096"; done
b9 9b ss build/test/ninfer_ss "-p 4096 -n 128 -r 2"
RUN_GREP='FAILED|Failure' run gpu 150 build/test/test_gpu
echo "total $(( $(date +%s) - t0 )) s"
