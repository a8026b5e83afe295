"""CPU accounting that respects container limits."""

from __future__ import annotations

import os
import sys


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may really use: the cgroup quota (v2 ``cpu.max`` or v1 CFS) and
    the affinity mask, not ``os.cpu_count()``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = open(f"{cgroup_root}/cpu.max", encoding="ascii").read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        try:
            q = int(open(f"{cgroup_root}/cpu/cpu.cfs_quota_us", encoding="ascii").read())
            p = int(open(f"{cgroup_root}/cpu/cpu.cfs_period_us", encoding="ascii").read())
            if q > 0 and p > 0:
                cpus = min(cpus, max(1, q // p))
        except (OSError, ValueError):
            pass
    return max(1, cpus)


def threads_per_rank(local_ranks: int) -> int:
    """``max(1, usable_cpus // local_ranks)``; logs when ranks outnumber CPUs."""
    cpus = usable_cpus()
    if local_ranks > cpus:
        print(
            f"trainpipe: {local_ranks} ranks on {cpus} usable CPUs: oversubscribed, expect slow steps", file=sys.stderr
        )
    return max(1, cpus // max(1, local_ranks))
