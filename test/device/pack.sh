#!/usr/bin/env bash
# a carry folder for a device call, within the run tool's 64 MiB (the working tree's tracked
# and untracked files count too: ~45 MB of it). usage, from the repo root:
#   bash test/device/pack.sh DIR SCRIPT NAME=PATH...
# DIR (.carry-sNN, git-ignored) gets SCRIPT, common.sh, fixtures.tar.xz (../shared/fixtures)
# and bins.tar.xz: each PATH stripped and stored as NAME (unpack puts NAME in build/test; one
# named ninfer also becomes build/apps/ninfer), in one solid xz -9e, which is smaller than the
# files packed one by one. build the binaries for sm_90a alone to save ~1.2 MB each: the
# compute_90 ptx that make GPU_ARCH=90 adds is of no use on the device, e.g.
#   nvcc -std=c++17 -O3 -lineinfo -cudart static -Xcompiler "-O3 -fopenmp" --expt-relaxed-constexpr \
#     -gencode arch=compute_90a,code=sm_90a -o /tmp/ninfer ninfer.cu -lgomp -lpthread -ldl -lrt
# prints the sizes and what is left of the limit.
set -eu
[ $# -ge 3 ] || { echo "usage: bash test/device/pack.sh DIR SCRIPT NAME=PATH..." >&2; exit 1; }
dir=$1 script=$2; shift 2
mkdir -p "$dir"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
names=()
for nb in "$@"; do
  name=${nb%%=*} path=${nb#*=}
  [ -f "$path" ] || { echo "pack.sh: $path: no such file (for $name)" >&2; exit 1; }
  strip -o "$stage/$name" "$path"
  names+=("$name")
done
XZ_OPT=-9e tar -C "$stage" -cJf "$dir/bins.tar.xz" "${names[@]}"
cp "$script" test/device/common.sh "$dir/"
tar -C ../shared -cJf "$dir/fixtures.tar.xz" fixtures
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r du -cb 2>/dev/null | awk 'END {print $1}')
carry=$(du -cb "$dir" | awk 'END {print $1}')
limit=$((64 * 1024 * 1024))
echo "pack.sh: bins.tar.xz $(stat -c %s "$dir/bins.tar.xz") B (${names[*]}), carry $carry B, tree $tree B;" \
     "left of the 64 MiB: $((limit - carry - tree)) B"
[ $((carry + tree)) -le $limit ] || { echo "pack.sh: over the limit" >&2; exit 1; }
