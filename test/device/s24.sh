#!/usr/bin/env bash
# session 24, call 1 (issue 16): f0f1507's binaries (ninfer, test_spec): test_spec's SpecGpu.*
# (the mtp round on the tma gemm's prefill: session 23's s23d, not run then), the kjv md5, then
# ninfer-bench of the 0.8b, 4b, 9b and 27b (tg128, pp512 / pp4096) as this session's base.
# pack with pack.sh into .carry-s24, carry it, run bash .carry-s24/s24.sh
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s24}
unpack
test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
models_done
for n in 0.8b 4b 9b 27b; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 16 > $OUT/convert_$n.log 2>&1 & done
RUN_GREP='FAILED|Failure' run spec 150 build/test/test_spec --gtest_filter='SpecGpu.*'
kjv_md5 build/apps/ninfer
models_done
b9 0.8b f0f1507 build/apps/ninfer "-p 512,4096 -n 128 -r 2"
b9 4b f0f1507 build/apps/ninfer "-p 4096 -n 128 -r 2"
b9 9b f0f1507 build/apps/ninfer "-p 4096 -n 128 -r 2"
b9 27b f0f1507 build/apps/ninfer "-p 4096 -n 128 -r 2"
echo "total $(( $(date +%s) - t0 )) s"
