#!/usr/bin/env bash
# session 19 (issue 16; not yet run: no device could be started after call 1): the wide kernel's
# copies alone (gemv_pattern_kernel) and its persistent versions (test/dev_kernels.cuh, 8-10).
# copy this file and common.sh to .carry-s19/ with bins.tar.xz (ninfer, test_kernels, test_gpu
# if the gpu stage runs: make GPU_ARCH=90) and fixtures.tar.xz (shared/fixtures), carry it, run
# bash .carry-s19/s19.sh. STAGES (comma list): kern (the Gemv.* tests: the versions' bits),
# bench (Bench.DISABLED_GemvPattern and Bench.DISABLED_GemvPersist: $OUT/bench.log), ncu (the second token's products of the
# 9b's first layers: $OUT/ncu.txt), tg (tg128 of $MODELS: the step's baseline in the same lease), gpu (test_gpu), kjv (the demo's md5)
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s19}
STAGES=${STAGES:-kern,bench,tg,kjv,gpu}
MODELS=${MODELS:-9b}
unpack
has gpu && test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
if has tg || has ncu; then for n in $MODELS; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done; fi
if has bench; then
  run bench 400 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemvPattern:Bench.DISABLED_GemvPersist'
  grep -E 'gemv pattern|gemv persist|chain|reference copy|device' $OUT/bench.log | head -3
  grep -E 'product C=1|pattern rw|contiguous rw|decode gemv chain' $OUT/bench.log | head -60
fi
models_done
B=build/apps/ninfer-bench
if has tg; then for n in $MODELS; do echo "== $n tg"; timeout 100 $B /tmp/$n.ninfer -p 0 -n 128 -r 3 2>&1 | grep '| tg'; done; fi
if has ncu; then
  timeout 200 ncu --clock-control none -k 'regex:gemv_x[sp]_kernel' --launch-skip ${NCU_SKIP:-150} --launch-count 8 --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats $B /tmp/9b.ninfer -p 0 -n 3 -r 1 --warmup 0 --no-cuda-graph > $OUT/ncu.txt 2>&1
  echo "== ncu rc=$?"; grep -E 'gemv_x[sp]_kernel|Duration|DRAM Throughput|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issue Slots Busy|Eligible Warps' $OUT/ncu.txt | head -160
fi
if has kjv; then for ps in 0; do echo "kjv $(build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum)"; done; fi
has kern && RUN_GREP='Failure|FAILED|differ' run kern 300 build/test/test_kernels --gtest_filter=${KERN:-'Gemv.*'}
has gpu && RUN_GREP='FAILED|Failure' run gpu 300 build/test/test_gpu
echo "total $(( $(date +%s) - t0 )) s"
