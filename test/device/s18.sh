#!/usr/bin/env bash
# session 18/19 (issue 16; ran at 8cc32a1, whose NINFER_PDL_EARLY and NINFER_GEMV_XP_BLOCKS knobs
# were then removed: bench-notes, session 19): when the decode kernels trigger their dependents (NINFER_PDL_EARLY). copy
# this file and common.sh to .carry-s18/ with bins.tar.xz (ninfer, test_gpu, test_kernels: make
# GPU_ARCH=90) and fixtures.tar.xz (shared/fixtures), carry it, run bash .carry-s18/s18.sh.
# STAGES (comma list, default all): kern (Gemv.* and the other kernel tests), gpu (test_gpu),
# kjv (the demo's greedy text at each EARLY mode), text (the synthetic 9b's greedy text at each
# mode), tg (tg128 of $MODELS at each of $EARLY; then of $XPB_MODELS at NINFER_GEMV_XP_BLOCKS=128,
# the 4096-row products at one block an sm, at each of $XPB_EARLY), deep (9b tg128 @ d32768 at 0 and the best),
# pp (9b pp512 / pp4096)
set -u
. "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
C=${C:-.carry-s18}
STAGES=${STAGES:-kern,gpu,kjv,text,tg}
EARLY=${EARLY:-0 1 2 3 4 7}
MODELS=${MODELS:-9b 4b 0.8b}
unpack
has gpu && test_models "tiny tiny-gqa1 tiny-gqa3" "groupwise-int bf16"
if has tg || has text || has deep || has pp; then for n in $MODELS; do python3 convert.py --synthetic $n -o /tmp/$n.ninfer --jobs 12 > $OUT/convert_$n.log 2>&1 & done; fi
has kern && RUN_GREP='Failure|FAILED' run kern 300 build/test/test_kernels --gtest_filter=${KERN:-'Gemv.*:Gemm.*:Attention.*:Gdn.*:Norms.*'}
if has kjv; then
  echo "== kjv demo greedy md5 at each NINFER_PDL_EARLY"
  for e in $EARLY; do echo "$e $(NINFER_PDL_EARLY=$e build/apps/ninfer models/kjv/kjv.ninfer --raw-prompt "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel" --temperature 0 --max-new 60 2>/dev/null | md5sum)"; done
fi
models_done
B=build/apps/ninfer-bench
if has text; then
  echo "== 9b synthetic greedy text md5 (ids) at each NINFER_PDL_EARLY"
  for e in $EARLY; do echo "$e $(NINFER_PDL_EARLY=$e timeout 60 build/apps/ninfer /tmp/9b.ninfer --raw-prompt "The quick brown fox jumps over the lazy dog" --temperature 0 --max-new 64 2>/dev/null | md5sum)"; done
fi
if has tg; then for n in $MODELS; do for e in $EARLY; do
  echo "== $n tg NINFER_PDL_EARLY=$e"; NINFER_PDL_EARLY=$e timeout 100 $B /tmp/$n.ninfer -p 0 -n 128 -r 3 2>&1 | grep '| tg'
done; done
  for n in ${XPB_MODELS:-9b 4b}; do for e in ${XPB_EARLY:-0 1 3 7}; do
    echo "== $n tg NINFER_GEMV_XP_BLOCKS=128 NINFER_PDL_EARLY=$e"; NINFER_GEMV_XP_BLOCKS=128 NINFER_PDL_EARLY=$e timeout 100 $B /tmp/$n.ninfer -p 0 -n 128 -r 3 2>&1 | grep '| tg'
  done; done
fi
if has deep; then for e in 0 ${BEST:-3}; do
  echo "== 9b tg128 @ d32768 NINFER_PDL_EARLY=$e"; NINFER_PDL_EARLY=$e timeout 150 $B /tmp/9b.ninfer -p 0 -n 128 -d 32768 -r 2 2>&1 | grep '| tg'
done; fi
if has pp; then for e in 0 ${BEST:-3}; do
  echo "== 9b pp NINFER_PDL_EARLY=$e"; NINFER_PDL_EARLY=$e timeout 200 $B /tmp/9b.ninfer -p 512,4096 -n 0 -r 3 2>&1 | grep '| pp'
done; fi
has gpu && RUN_GREP='FAILED|Failure' run gpu 300 build/test/test_gpu
echo "total $(( $(date +%s) - t0 )) s"
