"""CPU accounting that respects container limits."""

from __future__ import annotations

import os
import sys


def usable_cpus() -> int:
    """CPUs this process may really use: the cgroup quota and affinity, not ``os.cpu_count()``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max", encoding="ascii").read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        try:
            q = int(open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii").read())
            p = int(open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii").read())
            if q > 0 and p > 0:
                cpus = min(cpus, max(1, q // p))
        except (OSError, ValueError):
            pass
    return max(1, cpus)


def threads_per_rank(local_ranks: int) -> int:
    """``max(1, usable_cpus // local_ranks)``; logs when ranks outnumber CPUs."""
    cpus = usable_cpus()
    if local_ranks > cpus:
        print(f"trainpipe: {local_ranks} ranks on {cpus} usable CPUs: oversubscribed, expect slow steps", file=sys.stderr)
    return max(1, cpus // max(1, local_ranks))
