"""``python -m worker.pdeathsig PROGRAM [ARGS...]``: run PROGRAM so that it gets SIGTERM when its parent dies.

Parsl starts its interchange as a child of the worker; when the worker is
SIGKILLed, the interchange lives on, and with it the worker pool and its
block (a batch job holding nodes). On Linux this asks the kernel for a
parent-death signal (``prctl(PR_SET_PDEATHSIG)``, which survives ``exec``)
and then replaces itself with PROGRAM; elsewhere it only execs. PROGRAM
gets a session of its own, so a Ctrl-C at the worker's terminal reaches the
worker (which drains) and not the interchange. A launcher that sets
``MAPCAMPAIGN_PDEATHSIG_PARENT`` to its own pid closes the window in which it
could die before the request is made.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PARENT_VARIABLE = "MAPCAMPAIGN_PDEATHSIG_PARENT"  # pid of the launching process, when it sets it


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m worker.pdeathsig PROGRAM [ARGS...]", file=sys.stderr)
        sys.exit(2)
    # The launcher names itself: read here, getppid() would already be the reaper's pid if the launcher
    # died while this interpreter was starting, and the death would then go unnoticed.
    parent = int(os.environ.pop(PARENT_VARIABLE, "") or os.getppid())
    try:
        os.setsid()  # a session of its own: a Ctrl-C meant for the worker does not reach it
    except OSError:
        pass
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:  # the parent died before the request took effect
            sys.exit(1)
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
