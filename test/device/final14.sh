#!/usr/bin/env bash
# session 14's device runs (the tensor-core decode attention): test_kernels Attention / FlashPrefill,
# the attention versions (Bench.DISABLED_AttnVersions), test_gpu, test_spec's gpu round, ninfer-bench
# tg128 / tg128 @ d32768 / mtp, tg at depth per split target, bench_gpu's lanes steps, the served C = 64 rate (server on cpus 0-11,
# loadgen on 12-15). usage from the repo root on the device, copied into the carry folder beside
# common.sh, with bins.tar.xz (ninfer, test_kernels, bench_gpu, test_gpu, test_spec from
# make GPU_ARCH=90) and fixtures.tar.xz:
#   CARRY=.carry-X bash .carry-X/final14.sh [kernels,attn,tests,spec,bench,demo,plans,pin]
set -u
. "$(dirname "$0")/common.sh"  # has, unpack, test_models, model_9b, models_done, run
cd "$(dirname "$0")/.."
C=${CARRY:-.carry-s14}
STAGES=${1:-kernels,attn,tests,spec,bench}
RUN_GREP='lanes|differ|worst|rel-l2|^  (gpu )?kjv K='
RUN_HEAD=60
unpack
test_models "tiny tiny-gqa3" "groupwise-int bf16"
model_9b
models_done
has kernels && run test_kernels 300 build/test/test_kernels --gtest_filter='Attention.*:FlashPrefill.*'
if has attn; then
  timeout 300 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_AttnVersions' > $OUT/attn.log 2>&1
  echo "== attn rc=$?"; grep -vE '^\[ |^$|^device' $OUT/attn.log | head -40
fi
has tests && run test_gpu 300 build/test/test_gpu
has spec && run test_spec_gpu 300 build/test/test_spec --gtest_filter='SpecGpu*'
if has bench; then
  timeout 120 build/apps/ninfer-bench /tmp/9b.ninfer -p 512 -n 128 -r 2 2>&1 | tail -3
  timeout 120 build/apps/ninfer-bench /tmp/9b.ninfer -p 0 -n 128 -d 32768 -r 2 2>&1 | tail -1
  timeout 120 build/apps/ninfer-bench /tmp/9b.ninfer -p 0 -n 128 -d 32768 -r 2 --kv-dtype int8 2>&1 | tail -1
  timeout 120 build/apps/ninfer-bench /tmp/9b.ninfer -p 0 -n 128 -r 2 --spec mtp --draft-tokens 3 --lm-head-draft 2>&1 | tail -1
  timeout 200 build/test/bench_gpu /tmp/9b.ninfer 2>&1 | grep -E '^lanes|step graph|copy bandwidth'
fi
if has demo; then  # the kjv demo's prompt, greedy and the demo's sampling, gpu against the cpu path
  for a in "--temperature 0" "--temperature 0.7 --seed 2 --presence-penalty 0"; do
    build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said" $a --max-new 80 > $OUT/demo_gpu.txt 2>/dev/null
    build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said" $a --max-new 80 --cpu > $OUT/demo_cpu.txt 2>/dev/null
    cmp -s $OUT/demo_gpu.txt $OUT/demo_cpu.txt && echo "== demo $a: gpu = cpu" || { echo "== demo $a: gpu != cpu"; cat $OUT/demo_gpu.txt; echo; cat $OUT/demo_cpu.txt; echo; }
  done
fi
if has plans; then  # the split target (GpuTuning::attn_splits) at depth, one sequence
  for sp in ${PLANS:-64 128 256}; do
    echo "== attn_splits $sp"
    NINFER_ATT_SPLITS=$sp timeout 200 build/apps/ninfer-bench /tmp/9b.ninfer -p 0 -n 128 -d 4096,16384,32768 -r 2 2>&1 | grep '| tg'
  done
fi
if has pin; then
  up() { for i in $(seq 1 900); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 0.2; done; return 1; }
  taskset -c 0-11 build/apps/ninfer-serve /tmp/9b.ninfer --port 18092 --max-concurrency 64 --max-context 1024 --kv-capacity 65536 --log-stats-interval-ms 1000 2>$OUT/serve_pin.log & S=$!
  if up 18092; then
    timeout 200 taskset -c 12-15 python3 test/loadgen.py decode --url http://127.0.0.1:18092 --concurrency ${PIN_C:-64,64} --prompt-words 480 --max-tokens 256
  else echo "serve did not come up"; tail -3 $OUT/serve_pin.log; fi
  kill $S; wait $S 2>/dev/null
fi
echo "total $(( $(date +%s) - t0 )) s"
