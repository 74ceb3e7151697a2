#!/bin/bash
# issue 14, the branch's last device run: the prefix-reuse and state tests, main's gpu mtp
# tests over the merged tree, the server's refusals and notes on the gpu, a kjv chat compared
# with and without reuse in int8 kv, and --spec mtp served on the gpu (reuse off there).
cd "$(dirname "$0")"
ln -sf ninfer ninfer-serve
KJV=../models/kjv/kjv.ninfer
up() { for i in $(seq 1 600); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 0.1; done; return 1; }
mkdir -p ../build/models && NINFER_FIXTURES=fixtures python3 convert.py --synthetic tiny -o /tmp/tiny-hf >/dev/null 2>&1 && NINFER_FIXTURES=fixtures python3 convert.py /tmp/tiny-hf -o ../build/models/tiny.ninfer --weights groupwise-int >/dev/null 2>&1
(cd .. && .carry-batch/test_gpu --gtest_filter='GpuPrefix*:GpuState*:GpuEngineInterface*') 2>&1 | grep -E "^\[ |rel-l2|Failure|Expected|Which|actual|ninfer:" | tail -30
(cd .. && .carry-batch/test_spec --gtest_filter='SpecGpu*') 2>&1 | grep -E "^\[ |Failure|Expected|ninfer:" | tail -20
./ninfer-serve $KJV --max-concurrency 2 2>&1 | tail -1
./ninfer-serve $KJV --spec mtp --draft-tokens 3 --device-state-slots 2 2>&1 | tail -1
./ninfer-serve $KJV --port 18081 --kv-dtype int8 --device-state-slots 1 --log-stats-interval-ms 0 2>$OUT/int8_reuse.log & A=$!
./ninfer-serve $KJV --port 18082 --kv-dtype int8 --no-prefix-reuse --log-stats-interval-ms 0 2>$OUT/int8_plain.log & B=$!
./ninfer-serve $KJV --port 18083 --spec mtp --draft-tokens 3 --log-stats-interval-ms 0 2>$OUT/spec.log & C=$!
up 18081 && up 18082 && python3 loadgen.py chat --url http://127.0.0.1:18081 --compare http://127.0.0.1:18082 --turns 5 --user-words 80 --max-tokens 24
echo "int8 chat rc=$?"
up 18083 && python3 loadgen.py chat --url http://127.0.0.1:18083 --compare http://127.0.0.1:18082 --turns 2 --user-words 40 --max-tokens 24
echo "spec chat rc=$? (compared with int8 kv: outputs may differ)"
kill $A $B $C; wait $A $B $C 2>/dev/null
grep -E "memory plan|cached=" $OUT/spec.log | cut -c1-220
grep -oE "cached=[0-9]+ cache=[a-z]+" $OUT/int8_reuse.log | tr '\n' ' '; echo
