"""Run a command with CPU hogs beside it: the suite must pass on a machine that is busy with something else.

    python scripts/under_load.py [--hogs N] [--times K] -- make test

Starts ``N`` processes (default: one per core) that spin at full speed, runs the command ``K`` times in a row
(default 1) while they spin, stops them, and exits with the first failing run's code (0 when every run passed).
Each run's exit code and wall time are printed, and the CPU share the hogs took, so a note can say how loaded
the machine was. A flaky test (one that waits on a duration, or asserts one) shows up here: the suite's tests
wait on events, never on time.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def _spin() -> None:
    while True:
        pass


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="spinning processes (default: cores)")
    parser.add_argument("--times", type=int, default=1, help="runs of the command, one after another")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    wall0 = time.monotonic()
    first_failure = 0
    try:
        for n in range(1, args.times + 1):
            start = time.monotonic()
            code = subprocess.run(command, check=False).returncode
            print(
                f"under_load: run {n} of {args.times}: exit {code} in {time.monotonic() - start:.0f} s "
                f"beside {args.hogs} hog(s)",
                file=sys.stderr,
                flush=True,
            )
            first_failure = first_failure or code
    finally:
        hog_cpu = 0.0
        for hog in hogs:
            try:
                with open(f"/proc/{hog.pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                hog_cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except OSError:
                pass
            hog.terminate()
        wall = time.monotonic() - wall0
        print(
            f"under_load: the hogs took {hog_cpu:.0f} CPU-seconds of {wall * (os.cpu_count() or 1):.0f}",
            file=sys.stderr,
        )
    return first_failure


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
