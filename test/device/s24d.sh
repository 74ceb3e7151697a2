#!/usr/bin/env bash
# session 24, call 2 (issue 16), NOT RUN (no device could be started): the tiled weights in the
# product, which main holds as test/device/tiled.patch (git apply it, build, pack). the product (the loader re-tiles every
# grouped matrix the gpu multiplies by; XpWeights, the gemm's loads; a tied head's own tiled
# copy). binaries of 1f99563 (ninfer, test_kernels, test_gpu, test_spec) and f0f1507's ninfer
# (build/test/ninfer_base): the tiled kernel tests and Gemm.*, the 9b A/B, test_gpu, SpecGpu.*,
# the kjv md5, the 4b / 0.8b A/B. cut to fit the device time left. pack into .carry-s24d, carry
# it, run bash .carry-s24d/s24d.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s24d}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
model_9b
for n in 4b 0.8b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 2 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='FAILED|Failure' run kern 150 build/test/test_kernels --gtest_filter='Gemv.Tiled*:Gemv.PairEqualsTwoProducts:Gemv.FusedXTransforms:Gemm.*'
models_done
for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 9b $b $bin "-p 4096 -n 128 -r 2"; done
RUN_GREP='FAILED|Failure' run gpu 150 build/test/test_gpu
RUN_GREP='FAILED|Failure' run spec 100 build/test/test_spec --gtest_filter='SpecGpu.*'
kjv_md5 build/apps/ninfer
for n in 0.8b 4b; do for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  b9 $n $b $bin "-n 128 -r 2"; done; done
echo "total $(( $(date +%s) - t0 )) s"
