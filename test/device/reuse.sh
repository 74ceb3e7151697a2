#!/bin/bash
# issue 14 on the h200: the prefix-reuse gpu tests, the kjv server with and without reuse (one
# device slot: spill / restore) compared turn by turn, and a 10-turn chat on the synthetic 9b
# geometry (prefill saved, ttft by turn). run from the carry folder: binaries built here with
# GPU_ARCH=90 (test_gpu, ninfer), convert.py, test/loadgen.py; kjv from the checkout.
cd "$(dirname "$0")"
ln -sf ninfer ninfer-serve
KJV=../models/kjv/kjv.ninfer
mkdir -p ../build/models && NINFER_FIXTURES=fixtures python3 convert.py --synthetic tiny -o /tmp/tiny-hf >/dev/null && NINFER_FIXTURES=fixtures python3 convert.py /tmp/tiny-hf -o ../build/models/tiny.ninfer --weights groupwise-int >/dev/null
up() { for i in $(seq 1 600); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 0.1; done; return 1; }
(cd .. && .carry-batch/test_gpu --gtest_filter='GpuPrefix*:GpuState*:GpuEngineInterface*:GpuGeneration.GreedyMatchesCpuKjv') 2>&1 | grep -E "^\[|rel-l2|differ|Failure|Expected|Which|actual|ninfer:" | tail -40
./ninfer-serve $KJV --port 18081 --device-state-slots 1 --host-state-slots 2 --log-stats-interval-ms 0 2>$OUT/kjv_reuse.log & A=$!
./ninfer-serve $KJV --port 18082 --no-prefix-reuse --log-stats-interval-ms 0 2>$OUT/kjv_plain.log & B=$!
up 18081 && up 18082 && python3 loadgen.py chat --url http://127.0.0.1:18081 --compare http://127.0.0.1:18082 --turns 6 --user-words 80 --max-tokens 24
echo "kjv chat rc=$?"
kill $A $B; wait $A $B 2>/dev/null
grep -E "memory plan|cached=" $OUT/kjv_reuse.log | head -8
( time NINFER_FIXTURES=fixtures python3 convert.py --synthetic 9b -o /tmp/9b.ninfer --jobs 16 >/dev/null ) 2>&1 | grep real
./ninfer-serve /tmp/9b.ninfer --port 18083 --max-context 32768 --log-stats-interval-ms 0 2>$OUT/9b_reuse.log & A=$!
./ninfer-serve /tmp/9b.ninfer --port 18084 --max-context 32768 --no-prefix-reuse --log-stats-interval-ms 0 2>$OUT/9b_plain.log & B=$!
up 18083 && up 18084 && python3 loadgen.py chat --url http://127.0.0.1:18083 --compare http://127.0.0.1:18084 --turns 10 --system-words 1500 --user-words 1000 --max-tokens 32
echo "9b chat rc=$?"
kill $A $B; wait $A $B 2>/dev/null
grep -E "memory plan" $OUT/9b_reuse.log
grep -oE "prompt=[0-9]+ completion=[0-9]+ cached=[0-9]+ cache=[a-z]+ .*prefill_ms=[0-9.]+" $OUT/9b_reuse.log
grep -oE "prompt=[0-9]+ .*prefill_ms=[0-9.]+" $OUT/9b_plain.log
