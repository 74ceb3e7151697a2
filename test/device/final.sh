#!/usr/bin/env bash
# the lead's final device run: unpack the binaries built here, make the test models, run every
# gpu suite, the kjv gpu tests, a sanitizer pass and the 9b bench. usage: bash .carry-final/final.sh
set -u
cd "$(dirname "$0")/.."
C=.carry-final
export NINFER_FIXTURES=$PWD/$C/fixtures PYTHONUNBUFFERED=1
mkdir -p build/test build/models
tar -xJf $C/bins.tar.xz -C build/test
ln -sf ninfer build/test/ninfer-serve
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
for n in tiny tiny-gqa1 tiny-gqa3; do
  python3 convert.py --synthetic $n -o build/models/$n-hf >/dev/null 2>&1 &&
  python3 convert.py build/models/$n-hf -o build/models/$n.ninfer --weights groupwise-int >/dev/null 2>&1 &&
  python3 convert.py build/models/$n-hf -o build/models/$n-bf16.ninfer --weights bf16 >/dev/null 2>&1 &
done
python3 convert.py --synthetic 9b -o /tmp/9b.ninfer --jobs 12 >/dev/null 2>&1 &
wait; ls build/models; echo "models $(( $(date +%s) - t0 )) s"
summ() { grep -E '^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]' "$1" | sort | uniq -c | head -20; }
for t in test_kernels test_gpu test_tower test_spec; do
  [ -x build/test/$t ] || continue
  s=$(date +%s); timeout 200 build/test/$t > $OUT/$t.log 2>&1; rc=$?
  echo "== $t rc=$rc $(( $(date +%s) - s )) s"; grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' $OUT/$t.log | head -12
done
s=$(date +%s); NINFER_BIN=build/test/ninfer python3 -m pytest -q -p no:cacheprovider test/test_kjv.py 2>&1 | tail -2; echo "kjv $(( $(date +%s) - s )) s"
s=$(date +%s); NINFER_BIN=build/test/ninfer timeout 120 python3 -m pytest -q -p no:cacheprovider test/test_cli_vision.py 2>&1 | tail -2
s=$(date +%s); timeout 120 compute-sanitizer --tool memcheck build/test/test_gpu --gtest_filter='GpuGeneration.GraphMatchesEager' 2>&1 | tail -3; echo "sanitizer $(( $(date +%s) - s )) s"
build/test/bench_gpu /tmp/9b.ninfer --bench pp512,pp4096,tg128 2>&1 | tail -12
build/test/bench_gpu /tmp/9b.ninfer --bench tg128 --sample 2>&1 | tail -4
echo "total $(( $(date +%s) - t0 )) s"
