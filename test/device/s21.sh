#!/usr/bin/env bash
# session 21 (issue 16), first call: d2fc0cc's pending check (s20e.sh: the pair and gemm kernel
# tests, test_gpu, the kjv md5), the 9b baseline (pp512 / pp4096 / tg128), and ncu's kernel
# times of a 9b pp4096 at the default chunk (1024) summed by kernel. copy this file and
# common.sh to .carry-s21/ with bins.tar.xz (ninfer, test_kernels, test_gpu: make GPU_ARCH=90)
# and fixtures.tar.xz, carry it, run bash .carry-s21/s21.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s21}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
model_9b
RUN_GREP='Failure|FAILED' run kern 100 build/test/test_kernels --gtest_filter='Gemv.PairEqualsTwoProducts:Gemm.*'
models_done
RUN_GREP='FAILED|Failure' run gpu 150 build/test/test_gpu
echo "kjv $(build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum)"
echo "== 9b $(build/apps/ninfer --bench /tmp/9b.ninfer -p 512,4096 -n 128 -r 3 2>&1 | grep -E '\| (pp|tg)' | tr '\n' ' ')"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 240 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_pp.csv \
  build/apps/ninfer --bench /tmp/9b.ninfer -p 4096 -n 0 -r 1 --warmup 0 > $OUT/ncu_pp.out 2>&1
echo "== ncu rc=$?"; python3 test/device/ncu_sum.py $OUT/ncu_pp.csv 40 || tail -5 $OUT/ncu_pp.out
echo "total $(( $(date +%s) - t0 )) s"
