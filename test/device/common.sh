# the part lanes.sh, spec.sh, xp.sh and the session scripts share, sourced from the script's own
# folder (as cards.sh): the carry folder unpacked, the test models made, the stage and test
# helpers, the kjv md5 and bench lines (kjv_md5, b9). the
# script sets C (its carry folder, from the repo root) and STAGES, cds to the repo root, calls
# unpack, starts its models (test_models, model_9b) and waits for them with models_done.

# has STAGE: STAGE is in the comma list $STAGES
has() { case ",$STAGES," in *",$1,"*) return 0;; esac; return 1; }

# $C/fixtures.tar.xz (../shared/fixtures) into /tmp/fx (NINFER_FIXTURES), $C/bins.tar.xz (the
# build/test binaries made with make GPU_ARCH=90) into build/test; when ninfer is among them,
# build/apps/ninfer and its serve / bench names. prints the gpu and its clocks; t0 starts.
unpack() {
  mkdir -p /tmp/fx build/test build/models build/apps models
  tar -xJf $C/fixtures.tar.xz -C /tmp/fx
  export NINFER_FIXTURES=/tmp/fx/fixtures PYTHONUNBUFFERED=1
  tar -xJf $C/bins.tar.xz -C build/test
  if [ -e build/test/ninfer ]; then
    cp build/test/ninfer build/apps/ninfer
    ln -sf ninfer build/apps/ninfer-serve && ln -sf ninfer build/apps/ninfer-bench && ln -sf ninfer build/test/ninfer-serve
  fi
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
  t0=$(date +%s)
}

# test_models "NAMES" "WEIGHTS": in the background, for each synthetic model NAME (convert.py
# --synthetic, in build/models/NAME-hf) build/models/NAME.ninfer (groupwise-int) and
# NAME-bf16.ninfer (bf16) as WEIGHTS lists them, as make models does; $OUT/convert_NAME.log
test_models() {
  local n
  for n in $1; do
    ( python3 convert.py --synthetic $n -o build/models/$n-hf || exit 1
      for w in $2; do
        s=; [ $w = bf16 ] && s=-bf16
        python3 convert.py build/models/$n-hf -o build/models/$n$s.ninfer --weights $w || exit 1
      done ) > $OUT/convert_$n.log 2>&1 &
  done
}

# the synthetic 9b at /tmp/9b.ninfer, in the background; $OUT/convert_9b.log
model_9b() { python3 convert.py --synthetic 9b -o /tmp/9b.ninfer --jobs 12 > $OUT/convert_9b.log 2>&1 & }

# wait for the models (every background job) and say how long they took since unpack
models_done() { wait; echo "models $(( $(date +%s) - t0 )) s"; }

# run NAME TIMEOUT BINARY ARGS...: the output in $OUT/NAME.log; prints the exit status and the
# time, then gtest's verdict lines and those matching $RUN_GREP (the script's extended
# regexp), $RUN_HEAD lines at most (30)
run() {
  local n=$1 to=$2; shift 2
  local s=$(date +%s); timeout $to "$@" > $OUT/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc $(( $(date +%s) - s )) s"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]${RUN_GREP:+|$RUN_GREP}" $OUT/$n.log | head -${RUN_HEAD:-30}
}

# kjv_md5 BINARY...: the kjv demo prompt's greedy text (60 tokens) as an md5, plain and with
# --spec mtp --draft-tokens 3, at --prefill-chunk 1024 and 16 (16: pieces without a head)
kjv_md5() {
  local P="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" b c
  for b in "$@"; do for c in 1024 16; do
    echo "kjv $b chunk $c $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c 2>/dev/null | md5sum)"
    echo "kjv $b chunk $c spec $($b models/kjv/kjv.ninfer --raw-prompt "$P" --temperature 0 --max-new 60 --prefill-chunk $c --spec mtp --draft-tokens 3 2>/dev/null | md5sum)"
  done; done
}

# b9 MODEL LABEL BINARY "ARGS": ninfer-bench of /tmp/MODEL.ninfer, one line of its pp / tg rows
# (test, tok/s, fraction of the copy bandwidth)
b9() { echo "== $1 $2 $($3 --bench /tmp/$1.ninfer $4 2>&1 | grep -E '\| (pp|tg)' | awk -F'|' '{printf "%s %s %s;", $5, $6, $9}')"; }
