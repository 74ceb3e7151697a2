#!/usr/bin/env bash
# issue 14: the wide gemv (gemv_xp_kernel) on the device: the gemv correctness tests
# (ColumnsIndependentOfCount over the kernel's forms), the lanes tests end to end (test_gpu
# GpuLanes: batched greedy = one at a time), Bench.DISABLED_GemvWide (each 9b product and the
# chain at C = 1..64 in bench_wide_form's forms) and bench_gpu's lanes steps on the 9b synthetic.
# (the runs against the slice-staged kernel used this script at 84d9852, where NINFER_GEMV_XP=0
# still picked it.)
# usage (from the repo root on the device): CARRY=.carry-xp bash .carry-xp/xp.sh [stages]; stages a
# comma list of: gemv,lanes,bench,steps (default all). binaries: $CARRY/bins.tar.xz (test_kernels,
# test_gpu, bench_gpu built here with make GPU_ARCH=90), $CARRY/fixtures.tar.xz (../shared/fixtures).
set -u
. "$(dirname "$0")/common.sh"  # has, unpack, test_models, model_9b, models_done, run
cd "$(dirname "$0")/.."
C=${CARRY:-.carry-xp}
STAGES=${1:-gemv,lanes,bench,steps}
RUN_GREP='differ|Failure'
unpack
has lanes && test_models tiny groupwise-int
has steps && model_9b
has gemv && run gemv 300 build/test/test_kernels --gtest_filter='Gemv.*'
models_done
has lanes && run lanes 300 build/test/test_gpu --gtest_filter='GpuLanes.*'
has bench && run bench 400 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemvWide'
has bench && grep -E "chain" $OUT/bench.log
if has steps; then
  timeout 200 build/test/bench_gpu /tmp/9b.ninfer > $OUT/bench_gpu.log 2>&1; echo "== bench_gpu rc $?"
  grep -E '^lanes|copy bandwidth|step graph' $OUT/bench_gpu.log
fi
true
