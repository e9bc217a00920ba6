"""``python -m worker.pdeathsig PROGRAM [ARGS...]``: run PROGRAM so that it gets SIGTERM when its parent dies.

Parsl starts its interchange as a child of the worker; when the worker is
SIGKILLed, the interchange lives on, and with it the worker pool and its
block (a batch job holding nodes). On Linux this asks the kernel for a
parent-death signal (``prctl(PR_SET_PDEATHSIG)``, which survives ``exec``)
and then replaces itself with PROGRAM; elsewhere it only execs. PROGRAM
gets a session of its own, so a Ctrl-C at the worker's terminal reaches the
worker (which drains) and not the interchange.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m worker.pdeathsig PROGRAM [ARGS...]", file=sys.stderr)
        sys.exit(2)
    parent = os.getppid()
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
