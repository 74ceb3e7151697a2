#!/usr/bin/env bash
# session 23, call 4 (issue 16): 8610528's binaries (ninfer, test_spec): test_spec's SpecGpu.*
# (the mtp round on the tma gemm's prefill), then the 0.8b pp512 / pp4096 / tg128 (short: the
# session's device time was nearly spent). make the carry folder with pack.sh (.carry-s23d), carry it, run bash .carry-s23d/s23d.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s23d}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
models_done
for n in 0.8b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 16 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='FAILED|Failure' run spec 120 build/test/test_spec --gtest_filter='SpecGpu.*'
models_done
b9 0.8b tma build/apps/ninfer "-p 512,4096 -n 128 -r 2"
echo "total $(( $(date +%s) - t0 )) s"
