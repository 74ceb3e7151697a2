#!/usr/bin/env bash
# session 20 (issue 16), second call: the wgmma prefill gemm on mbarrier stages. copy this file
# and common.sh to .carry-s20b/ with bins.tar.xz (ninfer, test_kernels, test_gpu: make
# GPU_ARCH=90; ninfer_base: the binary of the commit before, for the a/b) and fixtures.tar.xz,
# carry it, run bash .carry-s20b/s20b.sh. STAGES (comma list, default all): kern (Gemm.* and
# Gemv.PairEqualsTwoProducts), bench (Bench.DISABLED_GemmVersions: the product, the barrier
# version and mma.sync at T = 4096), pp (ninfer-bench pp512 / pp4096 of $MODELS, base and new
# alternating), gpu (test_gpu), kjv (the demo's greedy md5, new and base)
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s20b}
STAGES=${STAGES:-kern,bench,pp,gpu,kjv}
MODELS=${MODELS:-9b 4b}
unpack
has gpu && test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
if has pp; then for n in $MODELS; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done; fi
has kern && RUN_GREP='Failure|FAILED|worst' run kern 300 build/test/test_kernels --gtest_filter=${KERN:-'Gemm.*:Gemv.PairEqualsTwoProducts'}
if has bench; then
  run bench 300 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemmVersions'
  grep -E 'gemm T=|product|x4096|x12288' $OUT/bench.log | head -20
fi
models_done
if has pp; then for n in $MODELS; do for b in base new base new; do
  bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
  echo "== $n $b $($bin --bench /tmp/$n.ninfer -p 512,4096 -n 0 -r 3 2>&1 | grep '| pp' | tr '\n' ' ')"
done; done
  for b in base new; do bin=build/apps/ninfer; [ $b = base ] && bin=build/test/ninfer_base
    echo "== 9b chunk 4096 $b $($bin --bench /tmp/9b.ninfer -p 4096 -n 0 -r 3 --prefill-chunk 4096 2>&1 | grep '| pp')"; done
fi
has gpu && RUN_GREP='FAILED|Failure' run gpu 400 build/test/test_gpu
if has kjv; then
  echo "== kjv demo, new / base (greedy md5)"
  for bin in build/apps/ninfer build/test/ninfer_base; do $bin models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum; done
fi
echo "total $(( $(date +%s) - t0 )) s"
