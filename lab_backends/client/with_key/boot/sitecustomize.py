"""Started by ``lab-backends with-key`` (and in a class's learner servers): every tritonclient call of this
Python carries the admin key, and a learner's identity.

Python imports ``sitecustomize`` at start-up from ``sys.path``; ``with-key`` puts this folder first
on ``PYTHONPATH``, so this runs before the command's own code, in every Python it starts. It
imports nothing heavy: it only watches for ``tritonclient._client`` being imported and then wraps
``InferenceServerClientBase._call_plugin``, the hook through which the HTTP, gRPC, HTTP-aio and
gRPC-aio clients pass their headers before every request (tritonclient >= May 2023, client PR
#301). The wrapper runs the client's own plugin first (e.g. ``BasicAuth``), then adds the key
under the name the client's protocol needs, unless the caller already gave that header (any case):

* HTTP (``tritonclient.http``, ``.http.aio``): header ``admin-key``
  (server ``src/http_server.cc`` ``RespondIfRestricted`` at r24.10: else 403);
* gRPC (``tritonclient.grpc``, ``.grpc.aio``): metadata ``triton-grpc-protocol-admin-key``
  (``src/grpc/grpc_server.h`` ``kRestrictedProtocolHeaderTemplate`` + the key's name; else
  ``UNAVAILABLE: This protocol is restricted``).

In a learner's server the hub puts this folder on ``PYTHONPATH`` and sets ``LAB_LEARNER`` and
``LAB_LEARNER_TOKEN`` (``lab_backends/learner.py`` says what the front door does with them): every
call then also carries headers ``lab-learner`` and ``lab-learner-token``, under the same names over
both protocols (gRPC metadata travels as HTTP/2 headers, which is where nginx reads them).

The key is read from the file named by ``LAB_WITH_KEY_FILE`` (else ``TRITON_ADMIN_KEY``), never
from a command line. This file must stay self-contained (standard library only): the command's
Python need not have ``lab_backends`` installed. Then the ``sitecustomize`` this one hides (the
next on ``sys.path``, e.g. Debian's) is run, as Python would have.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

HTTP_HEADER = "admin-key"
GRPC_HEADER = "triton-grpc-protocol-admin-key"
#: A learner's identity: (environment variable, header) pairs, as ``lab_backends.learner`` names them.
LEARNER_HEADERS = (("LAB_LEARNER", "lab-learner"), ("LAB_LEARNER_TOKEN", "lab-learner-token"))
_HERE = os.path.dirname(os.path.abspath(__file__))
_state = {"patched": False, "warned": False}


def _key() -> str:
    path = os.environ.get("LAB_WITH_KEY_FILE")
    if not path:
        return os.environ.get("TRITON_ADMIN_KEY", "")
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def _learner_headers() -> dict[str, str]:
    """The learner's identity headers, when the hub set both variables (else none)."""
    found = {header: os.environ.get(var, "") for var, header in LEARNER_HEADERS}
    return found if all(found.values()) else {}


def header_for(cls: type) -> str | None:
    """The key's header name for a client class (or a subclass of one), ``None`` for other classes."""
    for klass in cls.__mro__:
        module = getattr(klass, "__module__", "") or ""
        if module.startswith("tritonclient.grpc"):
            return GRPC_HEADER
        if module.startswith("tritonclient.http"):
            return HTTP_HEADER
    return None


def _patch(module) -> None:
    base = getattr(module, "InferenceServerClientBase", None)
    original = getattr(base, "_call_plugin", None)
    if original is None or getattr(original, "_lab_with_key", False):
        return
    try:
        key = _key()
    except OSError as exc:
        print(f"lab-backends with-key: cannot read the key file ({exc}); tritonclient calls go out WITHOUT the "
              "admin key", file=sys.stderr)
        key = ""
    learner = _learner_headers()

    def _call_plugin(self, request):
        original(self, request)  # the client's own plugin first
        name = header_for(type(self))
        if name is None:
            return
        headers = getattr(request, "headers", None) or {}
        given = {str(k).lower() for k in headers}
        added = {h: v for h, v in [*learner.items(), *([(name, key)] if key else [])] if h not in given}
        if added:
            request.headers = {**headers, **added}  # a new dict: the caller's stays as it was

    _call_plugin._lab_with_key = True
    base._call_plugin = _call_plugin
    _state["patched"] = True


def _after_import(name: str, module) -> None:
    if name == "tritonclient._client":
        _patch(module)
    elif not _state["patched"] and not _state["warned"]:
        _state["warned"] = True
        version = getattr(sys.modules.get("tritonclient"), "__version__", "?")
        print(f"lab-backends with-key: tritonclient {version} has no plugin hook (_call_plugin); its calls "
              "go out WITHOUT the admin key. Upgrade tritonclient.", file=sys.stderr)


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds the watched tritonclient modules as usual, and acts once each is executed."""

    WATCHED = ("tritonclient._client", "tritonclient.http", "tritonclient.grpc")

    def find_spec(self, name, path=None, target=None):
        if name not in self.WATCHED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def run_then_act(module):
            exec_module(module)
            _after_import(name, module)

        spec.loader.exec_module = run_then_act
        return spec


def _run_hidden_sitecustomize() -> None:
    """Run the ``sitecustomize`` this module hides on ``sys.path``, as ``site`` would have."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as exc:  # noqa: BLE001 - as site.py does: report, carry on
        print(f"Error in sitecustomize ({spec.origin}); set PYTHONVERBOSE for traceback:\n"
              f"{type(exc).__name__}: {exc}", file=sys.stderr)


if os.environ.get("LAB_WITH_KEY_FILE") or os.environ.get("TRITON_ADMIN_KEY") or _learner_headers():
    sys.meta_path.insert(0, _Watcher())
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]  # the command's own path
_run_hidden_sitecustomize()
