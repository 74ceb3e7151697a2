#!/usr/bin/env bash
# session 17 (issue 16): the ring gemv versions, the wgmma gemm's per-warpgroup stages. copy this file and
# common.sh to .carry-s17/ with bins.tar.xz (ninfer, test_gpu, test_kernels: make GPU_ARCH=90)
# and fixtures.tar.xz (shared/fixtures), carry it, run bash .carry-s17/s17.sh. STAGES (comma
# list, default all): kern (Gemv.*, Gemm.* and the other kernel tests), bench (Bench.DISABLED_GemvRing
# and Bench.DISABLED_GemmVersions: $OUT/bench.log), pp (ninfer-bench pp512 / pp4096 of the synthetic
# $MODELS, default 9b), p128k (the 9b's prefill of one 131072-token prompt, --prefill-chunk 1024
# and 4096), tg (tg128), ncu (the decode step's wide-kernel products of the second token, one
# layer's worth: $OUT/ncu.txt), occ (tg128 with NINFER_GEMV_OCC_ROWS unset, 16384 and 32768),
# gpu (test_gpu), kjv (the demo's greedy text, wgmma on and off)
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s17}
STAGES=${STAGES:-kern,bench,pp,p128k,tg,ncu,gpu,kjv}
unpack
has gpu && test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
MODELS=${MODELS:-9b}
if has tg || has pp || has p128k || has occ; then for n in $MODELS; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done; fi
has kern && RUN_GREP='Failure|FAILED' run kern 300 build/test/test_kernels --gtest_filter=${KERN:-'Gemv.*:Gemm.*:Attention.*:Gdn.*:Norms.*'}
if has bench; then
  run bench 400 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemmVersions:Bench.DISABLED_GemvRing'
  grep -E 'chain|reference copy|shared stages' $OUT/bench.log | head -60
fi
models_done
B=build/apps/ninfer-bench
if has pp; then for n in $MODELS; do
  echo "== $n pp"; timeout 200 $B /tmp/$n.ninfer -p 512,4096 -n 0 -r 3 2>&1 | grep '| pp'
  [ $n = 9b ] && timeout 200 $B /tmp/$n.ninfer -p 4096 -n 0 -r 2 --prefill-chunk 4096 -d 0,32768 2>&1 | grep '| pp'
done; fi
if has p128k; then for c in 1024 4096; do
  echo "== 9b one 131072-token prompt, --prefill-chunk $c"; timeout 120 $B /tmp/9b.ninfer -p 131072 -n 0 -r 1 --warmup 0 --prefill-chunk $c 2>&1 | grep '| pp'
done; fi
if has tg; then for n in $MODELS; do
  echo "== $n tg"; timeout 150 $B /tmp/$n.ninfer -p 0 -n 128 -r 3 2>&1 | grep '| tg'
done; fi
if has occ; then for n in $MODELS; do for r in unset 16384 32768; do
  echo "== $n NINFER_GEMV_OCC_ROWS=$r"
  if [ $r = unset ]; then timeout 100 $B /tmp/$n.ninfer -p 0 -n 128 -r 3 2>&1 | grep '| tg'
  else NINFER_GEMV_OCC_ROWS=$r timeout 100 $B /tmp/$n.ninfer -p 0 -n 128 -r 3 2>&1 | grep '| tg'; fi
done; done; fi
if has ncu; then
  timeout 200 ncu --clock-control none -k 'regex:gemv_x[sp]_kernel' --launch-skip 150 --launch-count 8 --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis $B /tmp/9b.ninfer -p 0 -n 3 -r 1 --warmup 0 --no-cuda-graph > $OUT/ncu.txt 2>&1
  echo "== ncu rc=$?"; grep -E 'gemv_x[sp]_kernel|Duration|DRAM Throughput|Achieved Occupancy|Stall Long|Warp Cycles Per Issued|Theoretical Occ' $OUT/ncu.txt | head -80
fi
has gpu && RUN_GREP='FAILED|Failure' run gpu 300 build/test/test_gpu
if has kjv; then
  echo "== kjv demo, NINFER_WGMMA 1 / 0 (greedy md5)"
  for t in 1 0; do NINFER_WGMMA=$t build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum; done
fi
echo "total $(( $(date +%s) - t0 )) s"
