#!/usr/bin/env bash
# session 24, call 2 (issue 16): the weights re-tiled for the decode products, measured before
# the product takes them. binaries of this tree (test_kernels, ninfer): Gemv.* (with
# Gemv.TiledEqualsTheProduct: the wide kernel on a tiled copy, memcmp against gemv()),
# Bench.DISABLED_GemvTiled (per shape and the 9b chain: product / wide untiled / wide tiled /
# the copies alone), then the refactored product (XpWeights as a template argument) end to end:
# the kjv md5 and 9b tg128. pack into .carry-s24b, carry it, run bash .carry-s24b/s24b.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s24b}
unpack
model_9b
RUN_GREP='FAILED|Failure' run gemv 300 build/test/test_kernels --gtest_filter='Gemv.*'
run bench_tiled 300 build/test/test_kernels --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_GemvTiled'
grep -vE "^\[|^$|^Note|^Running" $OUT/bench_tiled.log | head -100
kjv_md5 build/apps/ninfer
models_done
b9 9b tree build/apps/ninfer "-n 128 -r 3"
echo "total $(( $(date +%s) - t0 )) s"
