"""Run a command; print its wall seconds, stdout and the peak RSS (MB) of the largest process it ran.

python peak_rss.py CMD [ARG...]   -> one JSON line: rc, out, wall, rss
"""

import json
import resource
import subprocess
import sys
import time

t = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True, check=False)
wall = time.perf_counter() - t
if proc.returncode:
    sys.stderr.write(proc.stderr[-3000:])
print(
    json.dumps(
        {
            "rc": proc.returncode,
            "out": proc.stdout,
            "wall": wall,
            "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        }
    )
)
