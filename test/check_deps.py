# exit 0 when every package pinned in test/requirements.txt is importable at its pinned
# version, else 1 (make test then runs pip). no third-party imports here.
import importlib.metadata as md
import os
import sys

req = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.txt")
missing = []
for line in open(req):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, want = line.partition("==")
    name = name.split("[")[0]  # extras: the distribution's name without them
    try:
        have = md.version(name.strip())
    except md.PackageNotFoundError:
        missing.append(line)
        continue
    if want and have != want.strip():
        missing.append(f"{line} (have {have})")
if missing:
    print("test dependencies missing: " + ", ".join(missing), file=sys.stderr)
    sys.exit(1)
