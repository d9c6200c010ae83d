"""The server layer: start, reach and stop a real Triton, and prepare what it serves.

Contract: everything here talks to a ``tritonserver`` process (embedded from the PyTriton wheel,
remote, or in Docker) or to the files it reads (model repository, backend directory). Nothing here
sends inference requests or measures them: that is the client and measure layers above. May import
the shared basics (``errors``, ``paths``, ``waiting``, ``rest``) and nothing else of the package.

Public names: :class:`TritonServer` (the one class notebooks use; a facade over the ``local``,
``remote`` and ``docker`` targets), :class:`RunningServer` (its interface, for signatures), :class:`ServerOptions`,
:func:`free_ports`, and the model-repository helpers :func:`read_config`, :func:`config_text`.
"""

from lab_backends.server.options import RESTRICTED_APIS, ServerOptions
from lab_backends.server.ports import free_ports
from lab_backends.server.repository import ModelConfig, config_text, parse_config, read_config
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

__all__ = [
    "RESTRICTED_APIS", "ModelConfig", "RunningServer", "ServerOptions", "TritonServer",
    "config_text", "free_ports", "parse_config", "read_config",
]
