#!/usr/bin/env bash
# session 24 (issue 16): the session's first two calls in one (the device could not be started for
# either alone; their scripts went into this one). binaries of c334ef1's tree (ninfer, test_kernels, test_spec): Gemv.* (with
# Gemv.TiledEqualsTheProduct), Bench.DISABLED_GemvTiled, test_spec's SpecGpu.*, the kjv md5,
# then 9b pp4096 / tg128 and 0.8b tg128 if time is left. pack into .carry-s24c, carry it, run
# bash .carry-s24c/s24c.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s24c}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
model_9b
python3 convert.py --synthetic 0.8b -o /tmp/0.8b.ninfer --jobs 4 > $OUT/convert_0.8b.log 2>&1 &
RUN_GREP='FAILED|Failure' run gemv 240 build/test/test_kernels --gtest_filter='Gemv.*'
run bench_tiled 240 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemvTiled'
grep -vE "^\[|^$|^Note|^Running" $OUT/bench_tiled.log | head -100
models_done
RUN_GREP='FAILED|Failure' run spec 150 build/test/test_spec --gtest_filter='SpecGpu.*'
kjv_md5 build/apps/ninfer
b9 9b c334ef1 build/apps/ninfer "-p 4096 -n 128 -r 2"
b9 0.8b c334ef1 build/apps/ninfer "-p 4096 -n 128 -r 2"
echo "total $(( $(date +%s) - t0 )) s"
