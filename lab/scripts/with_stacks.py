"""Run a module as ``__main__`` with every thread's Python stack dumped on SIGUSR1 (the process goes on).

``python3 -m lab.scripts.with_stacks oscarkv.cli.main bench decode ...``: ``gpu_tp_full.sh`` times each step
out with ``timeout -s USR1 -k 15``, so a step that hangs leaves the stacks of rank 0 (here) and of every
worker rank (``oscarkv.engine.workers`` registers the same handler) in its log before it is killed.
"""

import faulthandler
import runpy
import signal
import sys

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
