"""The worker's side of its lifeline to the host that started it: end when that host is gone.

A local worker runs in a session of its own (so a timeout's kill reaches whatever it started), so
nothing ends it when its ``suite run`` dies by SIGKILL: it would train on until its own deadline,
beside the next run. The host hands it the read end of a pipe whose only write end the host keeps
(``PARENT_FD_ENV``). The host never writes; when its process ends, by any signal, the kernel
closes that write end and a read here returns end-of-file. The worker then removes its temp folder
(``RUN_FOLDER_ENV``: nobody else will) and kills its own process group.

Why a pipe and not ``prctl(PR_SET_PDEATHSIG)``: the death signal follows the *thread* that forked
the child, not the process (a backend run from a worker thread, as under Ray, would lose its worker
when that thread ends, and keep it when only the process's other threads die); it needs a
``preexec_fn``, which is unsafe in a process with threads (the telemetry samplers, the progress
line); and it kills at once, leaving the temp folder behind. A pipe's end-of-file comes when the
last holder of the write end is gone, which is the whole host process.

Imports only the standard library (the worker's rule).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Mapping

PARENT_FD_ENV = "SUITE_PARENT_FD"  # the read end of the host's pipe, inherited by the worker
RUN_FOLDER_ENV = "SUITE_RUN_FOLDER"  # the worker's temp folder (spec and result), removed when the host is gone
# The results folder the worker's run is for, and the host process that started it: how a later
# ``suite run`` on the same folder finds a worker still training there (``backends.lifeline``).
RESULTS_FOLDER_ENV = "SUITE_RESULTS_FOLDER"
ORCHESTRATOR_ENV = "SUITE_ORCHESTRATOR_PID"
RUN_FOLDER_PREFIX = "suite-run-"  # the only folders the worker ever removes


def end_with_parent(environ: Mapping[str, str] | None = None) -> threading.Thread | None:
    """Watch the host's pipe in a daemon thread; None when no pipe was given (a worker run by hand,
    or in a container, which its engine ends)."""
    own = environ is None
    environ = os.environ if environ is None else environ
    try:
        fd = int(environ[PARENT_FD_ENV])
    except (KeyError, ValueError):
        return None
    folder = environ.get(RUN_FOLDER_ENV)
    if own:  # the pipe is this process's: a program it starts must not take the number for its own
        os.environ.pop(PARENT_FD_ENV, None)
        os.environ.pop(RUN_FOLDER_ENV, None)

    def watch() -> None:
        try:
            while os.read(fd, 512):
                pass  # the host never writes; anything read is ignored
        except OSError:
            return  # not a pipe this process can read: no watch (the worker's own deadline still holds)
        parent_gone(folder)

    thread = threading.Thread(target=watch, name="suite-parent-watch", daemon=True)
    thread.start()
    return thread


def parent_gone(folder: str | None) -> None:
    """Remove the worker's temp folder, then SIGKILL its process group (itself included)."""
    if folder and os.path.basename(folder.rstrip(os.sep)).startswith(RUN_FOLDER_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)
    try:
        if os.getpgid(0) == os.getpid():  # it leads its group (the host starts it in a new session)
            os.killpg(0, signal.SIGKILL)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)
