#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
C=.carry-final
export NINFER_FIXTURES=$PWD/$C/fixtures PYTHONUNBUFFERED=1
mkdir -p build/test build/models
tar -xJf $C/bins.tar.xz -C build/test
t0=$(date +%s)
( python3 convert.py --synthetic tiny -o build/models/tiny-hf >/dev/null 2>&1 &&
  python3 convert.py build/models/tiny-hf -o build/models/tiny.ninfer --weights groupwise-int >/dev/null 2>&1 &&
  python3 convert.py build/models/tiny-hf -o build/models/tiny-bf16.ninfer --weights bf16 >/dev/null 2>&1 ) &
python3 convert.py --synthetic 9b -o /tmp/9b.ninfer --jobs 12 >/dev/null 2>&1 &
wait
timeout 120 build/test/test_tower > $OUT/test_tower.log 2>&1; echo "== test_tower rc=$?"; grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' $OUT/test_tower.log
build/test/bench_gpu /tmp/9b.ninfer --bench pp512,pp4096,tg128 > $OUT/bench.log 2>&1
build/test/bench_gpu /tmp/9b.ninfer --bench tg128 --sample > $OUT/bench_sample.log 2>&1
grep -v '^decode  \|^generate\|^memory' $OUT/bench.log | head -30; grep -i 'tg128' $OUT/bench_sample.log
echo "total $(( $(date +%s) - t0 )) s"
