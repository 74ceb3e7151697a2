#!/usr/bin/env bash
# issue 14's device run for the gpu lanes: unpack the binaries built here, make the test models,
# run test_gpu (GpuLanes: batched greedy equal to one-at-a-time, the scheduler on threads) and the
# gpu mtp tests (the slot groups changed under them), then the 9b synthetic served with
# --max-concurrency 64 under test/loadgen.py decode at C = 1..64 (512-token prompts, 256 tokens)
# and two poisson arrival rates, and the single-stream ninfer-bench tg128 beside it.
# usage (from the repo root on the device): [CARRY=.carry-X] bash .carry-lanes/lanes.sh [stages], stages a comma
# list of: kernels,tests,spec,load,bench,serve,pytest,long (default all); long: issue 16's 128K-token
# prefill on the 9b (ninfer-bench pp131072, pieces of 4096): serve runs both model cards'
# serve commands verbatim (synthetic 9b / 4b at the cards' paths) with an openai sdk chat each,
# pytest the real-server lanes tests (test_serve_lanes.py: kjv, concurrent = one at a time) on the gpu;
# profile: ncu's kernel times of one 64-lane step; pin: the served rates with the server and the
# load generator on separate cpus;
# draw: sampled streams (--temperature 0.6) at C = 16, 64 with the host sampler and with the lanes'
# draws (NINFER_LANE_DRAW=0 / 1), then test_serve_lanes.py with the draws on; wide: the wide gemv's
# versions (Bench.DISABLED_GemvWideVersions: the x prefetched / shared, C = 8..64)
set -u
. "$(dirname "$0")/cards.sh"  # card_serve_9b, card_serve_4b: the model cards' serve commands
. "$(dirname "$0")/common.sh"  # has, unpack, test_models, model_9b, models_done, run
cd "$(dirname "$0")/.."
C=${CARRY:-.carry-lanes}
STAGES=${1:-kernels,tests,spec,load,bench,serve,pytest,draw,wide,long}
RUN_GREP='lanes|scheduler'
unpack
test_models "tiny tiny-gqa3" "groupwise-int bf16"
if has load || has bench || has serve || has long || has draw || has profile || has pin; then model_9b; fi
models_done
has kernels && run test_kernels 300 build/test/test_kernels
has tests && run test_gpu 300 build/test/test_gpu ${GPU_FILTER:+--gtest_filter=$GPU_FILTER}  # GPU_FILTER: a gtest filter
has spec && run test_spec_gpu 300 build/test/test_spec --gtest_filter='SpecGpu*'
up() { for i in $(seq 1 900); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 0.2; done; return 1; }
if has load; then
  build/apps/ninfer-serve /tmp/9b.ninfer --port 18090 --max-concurrency 64 --max-context 1024 --kv-capacity 65536 --log-stats-interval-ms 1000 2>$OUT/serve64.log & S=$!
  if up 18090; then
    grep "memory plan" $OUT/serve64.log | cut -c1-400
    timeout 300 python3 test/loadgen.py decode --url http://127.0.0.1:18090 --concurrency 1,2,4,8,16,32,64 --prompt-words 480 --max-tokens 256
    for r in 4 16; do timeout 120 python3 test/loadgen.py poisson --url http://127.0.0.1:18090 --rate $r --requests 64 --prompt-words 480 --max-tokens 128; done
    echo "the scheduler's figures a second (the stats lines: steps, lanes a step, step and gap ms):"
    grep "stats:" $OUT/serve64.log | sed 's/.*decode_tok_s=\([0-9.]*\).*running=\([0-9]*\).* decode_steps=/tok_s=\1 running=\2 steps=/' | head -60
  else echo "serve64 did not come up"; tail -3 $OUT/serve64.log; fi
  kill $S; wait $S 2>/dev/null
fi
has wide && timeout 300 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemvWideVersions' 2>&1 | grep -vE '^\[|^$'
has bench && timeout 120 build/apps/ninfer-bench /tmp/9b.ninfer -p 512 -n 128 -r 2 2>&1 | tail -4
# ATT_MIN_KEYS="128 256 ...": bench_gpu once per decode attention split size (NINFER_ATT_MIN_KEYS)
for mk in ${ATT_MIN_KEYS:-128}; do
  has bench && echo "== bench_gpu, NINFER_ATT_MIN_KEYS=$mk" && NINFER_ATT_MIN_KEYS=$mk timeout 200 build/test/bench_gpu /tmp/9b.ninfer 2>&1 | grep -E '^lanes|step graph|copy bandwidth'
done
# profile: ncu's kernel times of one 64-lane step at a ~640-token context (bench_gpu's
# NINFER_PROFILE_LANES step), summed by kernel (test/device/ncu_sum.py)
if has profile; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  NINFER_PROFILE_LANES=1 timeout 300 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    --log-file $OUT/ncu_lanes.csv build/test/bench_gpu /tmp/9b.ninfer > $OUT/ncu_bench.out 2>&1
  echo "== ncu rc=$?"; python3 test/device/ncu_sum.py $OUT/ncu_lanes.csv 40 || tail -5 $OUT/ncu_bench.out
fi
# pin: the served C = 16 / 64 rates with the server on cpus 0-11 and the load generator on
# 12-15 (its python threads off the server's cores, as a client on another host), the stats
# lines a second beside them
if has pin; then
  taskset -c 0-11 build/apps/ninfer-serve /tmp/9b.ninfer --port 18092 --max-concurrency 64 --max-context 1024 --kv-capacity 65536 --log-stats-interval-ms 1000 2>$OUT/serve_pin.log & S=$!
  if up 18092; then
    echo "== pinned: server on cpus 0-11, loadgen on 12-15"
    timeout 200 taskset -c 12-15 python3 test/loadgen.py decode --url http://127.0.0.1:18092 --concurrency ${PIN_C:-16,64} --prompt-words 480 --max-tokens 256
    grep "stats:" $OUT/serve_pin.log | sed 's/.*decode_tok_s=\([0-9.]*\).*running=\([0-9]*\).* decode_steps=/tok_s=\1 running=\2 steps=/' | grep -v "steps=0 " | head -40
  else echo "serve (pin) did not come up"; tail -3 $OUT/serve_pin.log; fi
  kill $S; wait $S 2>/dev/null
fi
if has serve || has pytest || has draw; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $C/whl/*.whl && export PYTHONPATH=/tmp/site
fi
if has serve; then
  ln -sf /tmp/9b.ninfer models/qwen3_5_9b.ninfer
  card_serve_9b > $OUT/serve.out 2> $OUT/serve.err &
  sp=$!
  up 8080; head -3 $OUT/serve.err | cut -c1-300
  python3 test/device/openai_chat.py 8080 qwen3.5-9b
  kill $sp; wait $sp; echo "9b card serve exit $?"
  python3 convert.py --synthetic 4b -o /tmp/4b.ninfer --jobs 12 >/dev/null 2>&1; ln -sf /tmp/4b.ninfer models/qwen3_5_4b.ninfer
  card_serve_4b > $OUT/serve4b.out 2> $OUT/serve4b.err &
  sp=$!
  for i in $(seq 1 300); do grep -q listening $OUT/serve4b.err && break; kill -0 $sp 2>/dev/null || break; sleep 0.5; done
  echo "4b card:"; head -4 $OUT/serve4b.err | cut -c1-300
  if grep -q listening $OUT/serve4b.err; then python3 test/device/openai_chat.py 8000 Qwen3.5-4B; kill $sp; fi
  wait $sp; echo "4b card serve exit $?"
fi
has long && timeout 200 build/apps/ninfer-bench /tmp/9b.ninfer -p 131072 -n 0 -r 1 --warmup 0 --prefill-chunk 4096 2>&1 | tail -3
if has pytest; then
  s=$(date +%s); NINFER_BIN=build/test/ninfer timeout 400 python3 -m pytest -q -x -rs -p no:cacheprovider test/test_serve_lanes.py ${PYTEST_ARGS:-} > $OUT/pytest_lanes.log 2>&1
  echo "== pytest test_serve_lanes.py (gpu) rc=$? $(( $(date +%s) - s )) s"; tail -5 $OUT/pytest_lanes.log
fi
if has draw; then
  for d in 0 1; do
    NINFER_LANE_DRAW=$d build/apps/ninfer-serve /tmp/9b.ninfer --port 18091 --max-concurrency 64 --max-context 1024 --kv-capacity 65536 --log-stats-interval-ms 0 2>$OUT/serve_draw$d.log & S=$!
    if up 18091; then
      echo "== sampled streams, NINFER_LANE_DRAW=$d"
      timeout 200 python3 test/loadgen.py decode --url http://127.0.0.1:18091 --concurrency 16,64 --prompt-words 480 --max-tokens 256 --temperature 0.6
    else echo "serve (draw $d) did not come up"; tail -3 $OUT/serve_draw$d.log; fi
    kill $S; wait $S 2>/dev/null
  done
  s=$(date +%s); NINFER_LANE_DRAW=1 NINFER_BIN=build/test/ninfer timeout 400 python3 -m pytest -q -x -rs -p no:cacheprovider test/test_serve_lanes.py > $OUT/pytest_draw.log 2>&1
  echo "== pytest test_serve_lanes.py (gpu, lane draws) rc=$? $(( $(date +%s) - s )) s"; tail -5 $OUT/pytest_draw.log
fi
true
