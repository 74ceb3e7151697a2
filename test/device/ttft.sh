#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
C=.carry-final
export NINFER_FIXTURES=$PWD/$C/fixtures
mkdir -p build/test && tar -xJf $C/bins.tar.xz -C build/test
[ -f /tmp/9b.ninfer ] || python3 convert.py --synthetic 9b -o /tmp/9b.ninfer --jobs 12 >/dev/null 2>&1 || { echo convert failed; exit 1; }
B=build/test/ninfer
$B /tmp/9b.ninfer --info 2>&1 | grep -i -E 'vision|geometry' | head -5
for i in 1 2 3; do
  s=$(date +%s%N)
  $B /tmp/9b.ninfer --vision --image $C/img1024.jpg --prompt "Describe this image." --max-new 1 --greedy --max-context 4096 > /dev/null 2> $OUT/ttft$i.log
  e=$(date +%s%N); echo "run $i rc=$? wall $(( (e - s) / 1000000 )) ms"; cat $OUT/ttft$i.log | cut -c1-200 | head -8
done
s=$(date +%s%N); $B /tmp/9b.ninfer --prompt "Describe this image." --max-new 1 --greedy --max-context 4096 > /dev/null 2> $OUT/text.log; e=$(date +%s%N)
echo "text-only wall $(( (e - s) / 1000000 )) ms"; grep -E 'prompt [0-9]+ tokens' $OUT/text.log
