#!/usr/bin/env bash
# issue 16's device run (bench branch): the kernel tests of what changed (every gemv variant vs
# the cpu reference, the attention split plans), ninfer-bench's standard set on the 9b geometry,
# the gemv at 4 blocks of 8 warps per sm against the old pick (NINFER_GEMV_OCC_ROWS=0) and the
# attention split plans (NINFER_ATT_SPLITS, NINFER_ATT_MIN_KEYS) end to end, the 0.8b and 4b
# geometries, the per-shape gemv bench and the decode breakdown.
# binaries are built on the dev box (make GPU_ARCH=90 build/test/{ninfer,test_gpu,test_kernels,bench_gpu})
# and carried as .carry-bench/bins.tar.xz with convert.py and ../shared/fixtures (the synthetic
# models' tokenizer). usage: bash .carry-bench/bench.sh
set -u
cd "$(dirname "$0")/.."
C=.carry-bench
export PYTHONUNBUFFERED=1 NINFER_FIXTURES=$PWD/$C/fixtures
mkdir -p build/test
tar -xJf $C/bins.tar.xz -C build/test
ln -sf ninfer build/test/ninfer-bench
B=build/test/ninfer-bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(python3 $C/convert.py --synthetic 9b -o /tmp/9b.ninfer --jobs 12 >/dev/null 2>&1;
 python3 $C/convert.py --synthetic 4b -o /tmp/4b.ninfer --jobs 12 >/dev/null 2>&1;
 python3 $C/convert.py --synthetic 0.8b -o /tmp/0.8b.ninfer --jobs 12 >/dev/null 2>&1) &
timeout 150 build/test/test_kernels --gtest_filter='Gemv.*:Attn*' > $OUT/test_kernels.log 2>&1; el "test_kernels rc=$?"
grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]' $OUT/test_kernels.log | head
timeout 100 build/test/test_gpu --gtest_filter='GpuAttnPlan.*:GpuGeneration.AttentionSplitPlansAgreeKjv:GpuGeneration.GreedyMatchesCpuKjv:GpuGeneration.GraphMatchesEager' > $OUT/test_gpu.log 2>&1; el "test_gpu rc=$?"
grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|split plans' $OUT/test_gpu.log | head
$B models/kjv/kjv.ninfer --spec mtp --draft-tokens 2 -p 0 -n 8; el "spec on the gpu rc=$? (1 expected)"
$B models/kjv/kjv.ninfer -p 512 -n 128 -r 3 | tee $OUT/kjv.md
wait; ls -la /tmp/*.ninfer
{
$B /tmp/9b.ninfer -p 512,4096 -n 128 -d 0,4096 -r 3 -o json > $OUT/std.json; el "std rc=$?"
$B /tmp/9b.ninfer -p 4096 -n 0 -r 3 --prefill-chunk 4096
echo "== NINFER_GEMV_OCC_ROWS=0 (the old pick)"; NINFER_GEMV_OCC_ROWS=0 $B /tmp/9b.ninfer -p 0 -n 128 -d 0,4096 -r 3
for sk in 64:256 256:128 1024:128; do echo "== NINFER_ATT_SPLITS:MIN_KEYS=$sk"
  NINFER_ATT_SPLITS=${sk%:*} NINFER_ATT_MIN_KEYS=${sk#*:} $B /tmp/9b.ninfer -p 0 -n 128 -d 4096,32768 -r 2 --prefill-chunk 4096; done
for w in 0 16384; do echo "== 0.8b, 4b NINFER_GEMV_OCC_ROWS=$w"; for m in 0.8b 4b; do NINFER_GEMV_OCC_ROWS=$w $B /tmp/$m.ninfer -p 512,4096 -n 128 -r 3; done; done
} 2>&1 | tee $OUT/bench.md
el "bench done"
for w in 0 16384; do NINFER_GEMV_OCC_ROWS=$w build/test/bench_gpu /tmp/9b.ninfer --bench tg128 --reps 2 2>&1 | grep -E "^tg|^decode" ; done | tee $OUT/breakdown.txt
el "breakdown done"
NINFER_BENCH_LOG=$OUT/gemv_bench.txt timeout 120 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_Gemv:Bench.DISABLED_DecodeGemvChain9B' > /dev/null 2>&1; el "gemv bench rc=$?"
grep "chain" $OUT/gemv_bench.txt
python3 - <<'PY'
import json, os
rows = json.load(open(os.path.join(os.environ["OUT"], "std.json")))
for r in rows: print("%-16s %10.1f +- %6.1f  %7.1f GB/s  %5.1f%%" % (r["test"], r["avg_ts"], r["stddev_ts"], r["gbs"], 100 * r["copy_fraction"]))
PY
el total
