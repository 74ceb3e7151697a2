#!/usr/bin/env bash
# session 22 (issue 16): s22b.sh cut to the device time left (~300 s), the most needed first:
# Gemm.* and Bench.DISABLED_GemmVersions of ss-promote's test_kernels, the 9b prefill of the
# three binaries, the kjv md5, test_gpu, the 4b. binaries as s22b.sh's. copy this file and
# common.sh to .carry-s22/ with bins.tar.xz and fixtures.tar.xz, carry it, run bash .carry-s22/s22c.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s22}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED' run kern 120 build/test/test_kernels --gtest_filter='Gemm.*'
RUN_GREP='q4|q5|q6|gemm T' RUN_HEAD=12 run gemmv 90 build/test/test_kernels --gtest_filter='Bench.DISABLED_GemmVersions' --gtest_also_run_disabled_tests
models_done
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s %s;", $5, $6, $9}')"; }
bin_of() { case $1 in base) echo build/test/ninfer_base;; ss) echo build/test/ninfer_ss;; *) echo build/apps/ninfer;; esac; }
for b in base rs ss; do b9 9b $b $(bin_of $b) "-p 512,4096 -n 0 -r 2"; done
P="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel"
for b in build/apps/ninfer build/test/ninfer_ss; do for c in 1024 16; do
  echo "kjv $b chunk $c $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c 2>/dev/null | md5sum)"
  echo "kjv $b chunk $c spec $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c --spec mtp --draft-tokens 3 2>/dev/null | md5sum)"; done; done
RUN_GREP='FAILED|Failure' run gpu 150 build/test/test_gpu
for b in rs ss; do b9 4b $b $(bin_of $b) "-p 4096 -n 0 -r 2"; done
echo "total $(( $(date +%s) - t0 )) s"
