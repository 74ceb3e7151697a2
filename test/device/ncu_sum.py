"""sum an ncu --csv log (--metrics gpu__time_duration.sum) by kernel: calls, total us, share.
usage: python3 ncu_sum.py LOG [TOP]. ncu serializes the kernels, so the total is the kernels
alone (no overlap, no launch gaps), not the step's wall time"""
import csv
import sys
from collections import defaultdict

UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
k, mn, mu, mv = (head.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
tot, calls = defaultdict(float), defaultdict(int)
for r in rows:
    if r[mn] != "gpu__time_duration.sum":
        continue
    name = r[k].split("(")[0]
    tot[name] += float(r[mv].replace(",", "")) * UNIT[r[mu]]
    calls[name] += 1
all_us = sum(tot.values())
print("kernels %d launches, %.1f us in all (serialized)" % (sum(calls.values()), all_us))
for name, us in sorted(tot.items(), key=lambda x: -x[1])[: int(sys.argv[2]) if len(sys.argv) > 2 else 30]:
    print("%8.1f us %5.1f%% %4d x  %s" % (us, 100 * us / all_us, calls[name], name[:150]))
