"""Run a component's entrypoint as ``python -m trainpipe.components.NAME ARGS...`` does, and write the moment
its core starts (``time.time()``) to the file ``BENCH_FIRST_WORK`` names: a step's fixed cost (the
interpreter, its imports, reading and checking its settings and inputs) ends there.

python first_work.py NAME [ARG...]
"""

import os
import runpy
import sys
import time

import trainpipe.contract.entrypoint as entrypoint

_run = entrypoint.run


def _timed_run(name, model, core, argv=None, doc="", **options):
    def core_started(*args, **kwargs):
        with open(os.environ["BENCH_FIRST_WORK"], "w", encoding="utf-8") as fh:
            fh.write(repr(time.time()))
        return core(*args, **kwargs)

    return _run(name, model, core_started, argv, doc, **options)


entrypoint.run = _timed_run
NAME = sys.argv[1]
sys.argv = [f"trainpipe.components.{NAME}", *sys.argv[2:]]
runpy.run_module(f"trainpipe.components.{NAME}", run_name="__main__", alter_sys=True)
