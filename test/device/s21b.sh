#!/usr/bin/env bash
# session 21 (issue 16), second call: prefill's swiglu in gate_up's wgmma epilogue
# (gemm_swiglu), the gated norm a warp a head, rmsnorm's 16-byte rows. kernel tests (Gemm.*,
# Norms.*, the gated prep's bit-equality), test_gpu, the kjv md5; ninfer-bench base (d2fc0cc,
# build/test/ninfer_base) / new / new with NINFER_FUSE_SWIGLU=0, alternating; ncu's kernel
# times of the new 9b pp4096. copy this file and common.sh to .carry-s21b/ with bins.tar.xz
# (ninfer, ninfer_base, test_kernels, test_gpu: make GPU_ARCH=90) and fixtures.tar.xz, carry
# it, run bash .carry-s21b/s21b.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s21b}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
for n in 9b 4b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='Failure|FAILED|differ' run kern 150 build/test/test_kernels --gtest_filter='Gemm.*:Norms.*:Gemv.GatedNormPrepEqualsTheKernels:Gemv.FusedXTransforms'
models_done
RUN_GREP='FAILED|Failure' run gpu 200 build/test/test_gpu
for b in build/apps/ninfer build/test/ninfer_base; do
  echo "kjv $b $($b models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum)"; done
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s;", $5, $6}')"; }
for r in 1 2; do
  b9 9b base build/test/ninfer_base "-p 512,4096 -n 0 -r 3"
  b9 9b new build/apps/ninfer "-p 512,4096 -n 0 -r 3"
  NINFER_FUSE_SWIGLU=0 b9 9b new-noswiglu build/apps/ninfer "-p 512,4096 -n 0 -r 3"
done
b9 4b base build/test/ninfer_base "-p 4096 -n 128 -r 3"
b9 4b new build/apps/ninfer "-p 4096 -n 128 -r 3"
b9 9b base build/test/ninfer_base "-p 0 -n 128 -r 3"
b9 9b new build/apps/ninfer "-p 0 -n 128 -r 3"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 200 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_pp.csv \
  build/apps/ninfer --bench /tmp/9b.ninfer -p 4096 -n 0 -r 1 --warmup 0 > $OUT/ncu_pp.out 2>&1
echo "== ncu rc=$?"; python3 test/device/ncu_sum.py $OUT/ncu_pp.csv 24 || tail -5 $OUT/ncu_pp.out
echo "total $(( $(date +%s) - t0 )) s"
