#!/usr/bin/env bash
# issue 17's device run: the masked-sampling kernel test, constrained generation on the gpu
# against the host path, and decode tok/s on the 9b synthetic geometry with and without a
# schema (the cli's stats line). usage: bash .carry-structured/structured.sh
set -u
cd "$(dirname "$0")/.."
C=.carry-structured
export NINFER_FIXTURES=$PWD/$C/fixtures PYTHONUNBUFFERED=1
mkdir -p build/test build/models
tar -xJf $C/bins.tar.xz -C build/test
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
( python3 $C/convert.py --synthetic tiny -o build/models/tiny-hf >/dev/null 2>&1 &&
  python3 $C/convert.py build/models/tiny-hf -o build/models/tiny.ninfer --weights groupwise-int >/dev/null 2>&1 ) &
python3 $C/convert.py --synthetic 9b -o /tmp/9b.ninfer --jobs 14 >/dev/null 2>&1 &
timeout 60 build/test/test_kernels --gtest_filter='Sampling.*' > $OUT/test_kernels.log 2>&1; echo "== test_kernels Sampling.* rc=$?"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|OK \] Sampling.Mask' $OUT/test_kernels.log | head
wait; echo "models $(( $(date +%s) - t0 )) s"
timeout 90 build/test/test_gpu --gtest_filter='GpuGeneration.Constrained*:GpuGeneration.Sampled*' > $OUT/test_gpu.log 2>&1; echo "== test_gpu rc=$?"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|constrained:' $OUT/test_gpu.log | head
B=build/test/ninfer
P="Write a JSON record for the customer order described here."
for run in "none:" "simple:--json-schema $C/bench_simple.schema.json" "nested:--json-schema $C/bench_nested.schema.json" \
           "none-greedy:--greedy" "nested-greedy:--greedy --json-schema $C/bench_nested.schema.json"; do
  name=${run%%:*}; args=${run#*:}
  $B /tmp/9b.ninfer --raw-prompt "$P" --max-new 200 --seed 3 --max-context 1024 $args > $OUT/out-$name.txt 2> $OUT/err-$name.txt
  echo "$name rc=$? $(grep -E 'generated [0-9]+ tokens' $OUT/err-$name.txt)"
done
echo "total $(( $(date +%s) - t0 )) s"
