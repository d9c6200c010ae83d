"""Triton Backends Workbench: the helper package behind the notebooks.

The notebooks narrate; this package does the work against a real Triton server.
"""

from lab_backends.errors import LabBackendsError, ModelLoadError, ServerStartupTimeoutError
from lab_backends.server.triton_server import TritonServer

__all__ = ["TritonServer", "LabBackendsError", "ModelLoadError", "ServerStartupTimeoutError"]
__version__ = "0.1.0"
