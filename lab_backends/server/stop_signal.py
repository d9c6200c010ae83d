"""SIGTERM as a stop request: ``lab-backends serve``, ``bench`` and ``lab`` unwind and stop what they started.

The handler raises :class:`StopRequested` in the main thread, wherever it is, so ``with TritonServer``
and the ``finally`` blocks run as they do for Ctrl-C. Written by hand because the stop must survive
gevent, which no library arranges for us: see :class:`StopRequested`.
"""

from __future__ import annotations

import signal
import sys


class StopRequested(KeyboardInterrupt):
    """Raised by the SIGTERM handler so ``with TritonServer`` unwinds and stops the server.

    A KeyboardInterrupt, not an Exception, for two reasons. tritonclient.http runs on gevent, and a
    signal handler that raises while gevent's hub waits on a socket raises in the hub: the hub prints
    any error that is not one of ``Hub.SYSTEM_ERROR`` (KeyboardInterrupt, SystemExit, SystemError)
    and goes on (an Exception here was printed, a traceback and a time stamp, and serve kept running
    until SIGKILL 30 s later). And supervision's ``except Exception`` guards (a stub check must never
    end it) must not swallow a stop either; ``except KeyboardInterrupt`` already means "asked to stop".
    """


def _raise_stop(signum: int, frame: object) -> None:
    # gevent's hub prints what reaches it unless its class is in Hub.NOT_ERROR (documented for this, and
    # still re-raised in the main greenlet as a SYSTEM_ERROR): a stop is no error, so no traceback.
    # gevent is there only once tritonclient.http was imported (deferred, tests/test_architecture.py).
    # The main thread's hub holds its own NOT_ERROR (its resolver adds socket errors to it).
    gevent_hub = sys.modules.get("gevent.hub")
    hub = gevent_hub.get_hub() if gevent_hub is not None else None
    if hub is not None and not issubclass(StopRequested, hub.NOT_ERROR):
        hub.NOT_ERROR = (*hub.NOT_ERROR, StopRequested)
    raise StopRequested()


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises :class:`StopRequested` in the main thread, as Ctrl-C would."""
    signal.signal(signal.SIGTERM, _raise_stop)
