#!/usr/bin/env bash
# session 20 (issue 16): the input projections' pairs in one launch (gemv2, GpuTuning::pair).
# copy this file and common.sh to .carry-s20/ with bins.tar.xz (ninfer, test_kernels, test_gpu:
# make GPU_ARCH=90) and fixtures.tar.xz (shared/fixtures), carry it, run bash .carry-s20/s20.sh.
# STAGES (comma list, default all): kern (Gemv.* with Gemv.PairEqualsTwoProducts), tg (tg128 of
# $MODELS with NINFER_PAIR=0 and 1 alternating, twice each, and at depth 32768 for the 9b),
# gpu (test_gpu: LaunchKnobsOffBitIdentical has pair off), kjv (the demo's greedy md5, pair on / off)
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s20}
STAGES=${STAGES:-kern,tg,gpu,kjv}
MODELS=${MODELS:-9b 4b 0.8b}
unpack
has gpu && test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
if has tg; then for n in $MODELS; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done; fi
has kern && RUN_GREP='Failure|FAILED|differ' run kern 300 build/test/test_kernels --gtest_filter=${KERN:-'Gemv.*'}
models_done
B=build/apps/ninfer-bench
if has tg; then for n in $MODELS; do for p in 0 1 0 1; do
  echo "== $n NINFER_PAIR=$p $(NINFER_PAIR=$p timeout 100 $B /tmp/$n.ninfer -p 0 -n 128 -r 3 2>&1 | grep '| tg')"
done; done
  for p in 0 1; do echo "== 9b @32768 NINFER_PAIR=$p $(NINFER_PAIR=$p timeout 150 $B /tmp/9b.ninfer -p 0 -n 128 -r 2 -d 32768 2>&1 | grep '| tg')"; done
fi
has gpu && RUN_GREP='FAILED|Failure' run gpu 400 build/test/test_gpu
if has kjv; then
  echo "== kjv demo, NINFER_PAIR 1 / 0 (greedy md5)"
  for p in 1 0; do NINFER_PAIR=$p build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum; done
fi
echo "total $(( $(date +%s) - t0 )) s"
