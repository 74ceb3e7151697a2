#!/usr/bin/env bash
# session 4's device run for the gpu mtp round (issue 13): unpack the binaries built here, make
# the test models, run the gemv and gpu suites, the gpu round's tests, a sanitizer pass on rounds,
# bench_spec on the 9b (K = 3 with and without --lm-head-draft, K = 1), bench_gpu's tg128, and
# the 9b card's serve command verbatim answering an openai sdk chat with mtp on.
# usage (from the repo root on the device): bash .carry-final/spec.sh [stages], stages a
# comma list of: tests,sanitizer,bench,bench1,serve (default tests,sanitizer,bench,serve)
set -u
. "$(dirname "$0")/cards.sh"  # card_serve_9b, card_serve_4b: the model cards' serve commands
. "$(dirname "$0")/common.sh"  # has, unpack, test_models, model_9b, models_done, run
cd "$(dirname "$0")/.."
C=.carry-final
STAGES=${1:-tests,sanitizer,bench,serve}
RUN_GREP='^  (gpu )?kjv K=' RUN_HEAD=40
unpack
test_models "tiny tiny-gqa3" "groupwise-int bf16"
model_9b
wait; ls build/models; models_done
if has tests; then
  run test_kernels 200 build/test/test_kernels
  has nogpu || run test_gpu 200 build/test/test_gpu
  run test_spec_gpu 400 build/test/test_spec --gtest_filter='SpecGpu*'
fi
if has sanitizer; then
  s=$(date +%s); timeout 200 compute-sanitizer --tool memcheck build/test/test_spec --gtest_filter='SpecGpu.ForcedDrafts*' > $OUT/sanitizer.log 2>&1
  tail -4 $OUT/sanitizer.log; echo "sanitizer $(( $(date +%s) - s )) s"
fi
if has bench; then
  for a in "--draft-tokens 3 --lm-head-draft" "--draft-tokens 3" "--draft-tokens 1 --lm-head-draft" "--draft-tokens 2 --lm-head-draft"; do
    build/test/bench_spec /tmp/9b.ninfer $a 2>&1 | grep -v "loading weights" | tail -14
  done
  ln -sf ninfer build/test/ninfer-bench
  build/test/ninfer-bench /tmp/9b.ninfer -p 512 -n 128 -r 3 2>&1 | tail -4
  build/test/ninfer-bench /tmp/9b.ninfer -p 0 -n 128 -r 3 --spec mtp --draft-tokens 3 --lm-head-draft 2>&1 | tail -3
fi
if has bench1; then  # the K=3 draft-head round alone
  build/test/bench_spec /tmp/9b.ninfer --draft-tokens 3 --lm-head-draft 2>&1 | grep -v "loading weights" | tail -16
fi
if has serve; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $C/whl/*.whl && export PYTHONPATH=/tmp/site
  ln -sf /tmp/9b.ninfer models/qwen3_5_9b.ninfer
  card_serve_9b > $OUT/serve.out 2> $OUT/serve.err &
  sp=$!
  for i in $(seq 1 120); do grep -q listening $OUT/serve.err && break; sleep 0.5; done
  head -5 $OUT/serve.err
  python3 $C/openai_chat.py 8080 qwen3.5-9b
  kill $sp; wait $sp; echo "serve exit $? (stdout bytes: $(wc -c < $OUT/serve.out))"; tail -3 $OUT/serve.err
  # the 4b card's command, verbatim, against the synthetic 4b: how far it gets
  python3 convert.py --synthetic 4b -o /tmp/4b.ninfer --jobs 12 >/dev/null 2>&1; ln -sf /tmp/4b.ninfer models/qwen3_5_4b.ninfer
  card_serve_4b > $OUT/serve4b.out 2> $OUT/serve4b.err &
  sp=$!
  for i in $(seq 1 120); do grep -q listening $OUT/serve4b.err && break; kill -0 $sp 2>/dev/null || break; sleep 0.5; done
  echo "4b card:"; head -8 $OUT/serve4b.err
  if grep -q listening $OUT/serve4b.err; then python3 $C/openai_chat.py 8000 Qwen3.5-4B; kill $sp; fi
  wait $sp; echo "4b serve exit $?"
fi
echo "total $(( $(date +%s) - t0 )) s"
