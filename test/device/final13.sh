#!/usr/bin/env bash
# session 13's final device run (call 5): test_kernels Gemv / Attention, test_gpu, the attention
# forms (Bench.DISABLED_AttnVersions), ninfer-bench tg128 and tg128 @ d32768, bench_gpu's lanes steps,
# the served C = 16 / 32 / 64 rates (server on cpus 0-11, loadgen on 12-15). usage from the repo root on
# the device, copied into the carry folder beside common.sh (as lanes.sh), with bins.tar.xz (ninfer,
# test_kernels, bench_gpu, test_gpu from make GPU_ARCH=90) and fixtures.tar.xz:
#   CARRY=.carry-X bash .carry-X/final13.sh [kernels,tests,attn,bench,pin]
set -u
. "$(dirname "$0")/common.sh"  # has, unpack, test_models, model_9b, models_done, run
cd "$(dirname "$0")/.."
C=${CARRY:-.carry-s13}
STAGES=${1:-kernels,tests,attn,bench,pin}
RUN_GREP='lanes|differ'
unpack
test_models "tiny tiny-gqa3" "groupwise-int bf16"
model_9b
models_done
has kernels && run test_kernels 300 build/test/test_kernels --gtest_filter='Gemv.*:Attention.*:Attn*'
has tests && run test_gpu 300 build/test/test_gpu
if has attn; then
  timeout 300 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_AttnVersions' > $OUT/attn.log 2>&1
  echo "== attn rc=$?"; grep -vE '^\[|^$|copy bandwidth|^device' $OUT/attn.log | head -40
fi
if has wide; then
  timeout 300 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemvWideVersions' > $OUT/wide.log 2>&1
  echo "== wide rc=$?"; grep chain $OUT/wide.log | grep -E "version (0|1|7)"
fi
if has bench; then
  timeout 120 build/apps/ninfer-bench /tmp/9b.ninfer -p 512 -n 128 -r 2 2>&1 | tail -3
  timeout 120 build/apps/ninfer-bench /tmp/9b.ninfer -p 0 -n 128 -d 32768 -r 2 2>&1 | tail -1
  timeout 200 build/test/bench_gpu /tmp/9b.ninfer 2>&1 | grep -E '^lanes|step graph|copy bandwidth'
fi
if has pin; then
  up() { for i in $(seq 1 900); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 0.2; done; return 1; }
  taskset -c 0-11 build/apps/ninfer-serve /tmp/9b.ninfer --port 18092 --max-concurrency 64 --max-context 1024 --kv-capacity 65536 --log-stats-interval-ms 1000 2>$OUT/serve_pin.log & S=$!
  if up 18092; then
    timeout 250 taskset -c 12-15 python3 test/loadgen.py decode --url http://127.0.0.1:18092 --concurrency ${PIN_C:-16,32,64,64,64,64} --prompt-words 480 --max-tokens 256
    grep "stats:" $OUT/serve_pin.log | sed 's/.*decode_tok_s=\([0-9.]*\).*running=\([0-9]*\).* decode_steps=/tok_s=\1 running=\2 steps=/' | grep -v "steps=0 " | grep "lanes_per_step=6[34]" | head -40
  else echo "serve did not come up"; tail -3 $OUT/serve_pin.log; fi
  kill $S; wait $S 2>/dev/null
fi
echo "total $(( $(date +%s) - t0 )) s"
