"""compare the device code (sass) of two builds of ninfer.cu kernel by kernel: for a change that
must not touch what the gpu runs (a refactor of device code, host-only edits), where no gpu is at
hand to time it. registers renamed count as a difference too, and a second pass ignores them.

  nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 -cubin -o a.cubin A.cu
  cuobjdump -sass a.cubin > a.sass      (cuobjdump: the cuda toolkit, or pip's nvidia-cuda-cuobjdump)
  python3 test/sass_diff.py a.sass b.sass

exit 0 when every kernel's instructions are the same, 1 otherwise."""
import re
import sys


def kernels(path, rename):
    out, cur = {}, None
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\*", line)
        if m and cur is not None:
            ins = m.group(1)
            if rename:
                ins = re.sub(r"\bU?R\d+\b", "R", re.sub(r"\bU?P\d\b", "P", ins))
            cur.append(ins)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    worst = 0
    for rename in (False, True):
        a, b = kernels(sys.argv[1], rename), kernels(sys.argv[2], rename)
        only = sorted(set(a) ^ set(b))
        diff = sorted(k for k in set(a) & set(b) if a[k] != b[k])
        print("%s: %d of %d kernels differ, %d in one build only" % (
            "registers renamed away" if rename else "as compiled", len(diff), len(set(a) | set(b)), len(only)))
        for k in diff:
            print("  %s: %d vs %d instructions" % (k, len(a[k]), len(b[k])))
        for k in only:
            print("  only in %s: %s" % (sys.argv[1] if k in a else sys.argv[2], k))
        worst = max(worst, len(diff) + len(only))
    sys.exit(1 if worst else 0)


if __name__ == "__main__":
    main()
