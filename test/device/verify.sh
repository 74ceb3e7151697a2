#!/usr/bin/env bash
# issue 16's second device run (bench branch): the final defaults (attention plan 256 / 128,
# GEMV_XS_8X3_4 for hidden sizes <= 2560) through ninfer-bench on the 9b, 4b and 0.8b geometries,
# the gpu tests of the plan on kjv, and the 9b decode breakdown. usage: bash .carry-bench/verify.sh
set -u
cd "$(dirname "$0")/.."
C=.carry-bench
export PYTHONUNBUFFERED=1 NINFER_FIXTURES=$PWD/$C/fixtures
mkdir -p build/test
tar -xJf $C/bins.tar.xz -C build/test
ln -sf ninfer build/test/ninfer-bench
B=build/test/ninfer-bench
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(python3 $C/convert.py --synthetic 9b -o /tmp/9b.ninfer --jobs 12 >/dev/null 2>&1;
 python3 $C/convert.py --synthetic 4b -o /tmp/4b.ninfer --jobs 12 >/dev/null 2>&1;
 python3 $C/convert.py --synthetic 0.8b -o /tmp/0.8b.ninfer --jobs 12 >/dev/null 2>&1) &
timeout 90 build/test/test_gpu --gtest_filter='GpuAttnPlan.*:*Kjv*:*kjv*' > $OUT/test_gpu.log 2>&1; el "test_gpu rc=$?"
grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|split plans' $OUT/test_gpu.log | head
wait
{
$B /tmp/9b.ninfer -p 512,4096 -n 128 -r 3
$B /tmp/9b.ninfer -p 0 -n 128 -d 4096,32768 -r 2 --prefill-chunk 4096
for m in 4b 0.8b; do $B /tmp/$m.ninfer -p 0 -n 128 -r 3; done
} 2>&1 | tee $OUT/bench.md
el "bench done"
build/test/bench_gpu /tmp/9b.ninfer 2>&1 | grep -E "^decode|^config" | tee $OUT/breakdown.txt
el total
