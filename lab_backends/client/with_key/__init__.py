"""``lab-backends with-key [--key-file F] -- COMMAND...``: an unchanged tritonclient script, with the admin key.

``lab-backends serve`` restricts Triton's admin APIs (model repository, statistics, trace, shared
memory, logging) by a key, and NVIDIA's tritonclient examples (``simple_grpc_shm_client.py``,
``simple_http_infer_client.py``'s statistics, ``simple_grpc_model_control.py``, ...) call them
without any header. ``with-key`` runs COMMAND so that every tritonclient call of every Python it
starts (HTTP, gRPC, sync and aio) carries the key, under the name its protocol needs: header
``admin-key`` over HTTP, metadata ``triton-grpc-protocol-admin-key`` over gRPC. A header the
script gives itself wins. How: ``boot/sitecustomize.py`` (its docstring has the details and the
server source lines) is put first on ``PYTHONPATH``.

Written by hand because no maintained tool does this: tritonclient's plugins
(``register_plugin``, ``BasicAuth``) must be registered by the script itself, which the examples do
not do; tritonclient reads no header from the environment; perf_analyzer's ``-H`` covers only
perf_analyzer. The key never goes on a command line (``ps`` shows those): the child gets the
key *file's path* in ``LAB_WITH_KEY_FILE``, or, without ``--key-file``, reads the
``TRITON_ADMIN_KEY`` already in its environment. Limits: a Python started with ``-I``, ``-E`` or
``-S`` skips ``sitecustomize`` (and so the key); non-Python programs are not affected; a client
made with ``verbose=True`` (the examples' ``-v``) prints its headers, the key among them.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Mapping, Sequence

from lab_backends.errors import LabBackendsError

WITH_KEY_DESCRIPTION = """\
Run COMMAND (any command that starts Python, e.g. python simple_grpc_shm_client.py
-u 127.0.0.1:PORT) so that every tritonclient call it makes (HTTP, gRPC, sync and aio) carries
the admin key of `lab-backends serve --admin-key-file F`: header 'admin-key' over HTTP,
metadata 'triton-grpc-protocol-admin-key' over gRPC. The script is not changed; a header it
sets itself wins. The key is passed as the file's path, never on a command line."""
BOOT_DIR = Path(__file__).resolve().parent / "boot"
#: The environment variable that names the key file for the child's ``sitecustomize``.
KEY_FILE_VAR = "LAB_WITH_KEY_FILE"


class WithKeyError(LabBackendsError):
    """``with-key`` cannot run: no key, an unreadable key file, no command."""


def check_key_file(path: str | Path) -> tuple[Path, str]:
    """The key file as an absolute path, and a warning ("" if none) when others may read it."""
    path = Path(path).expanduser().absolute()
    try:
        info = path.stat()
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise WithKeyError(f"cannot read the key file {path}: {exc.strerror or exc}; start the server with "
                           f"`lab-backends serve --admin-key-file {path}` (it writes the file)") from None
    if not stat.S_ISREG(info.st_mode) or not key:
        raise WithKeyError(f"{path} holds no key: it should be the file `lab-backends serve --admin-key-file` wrote")
    warning = ""
    if info.st_mode & 0o077:
        warning = (f"warning: {path} is readable by other users (mode {stat.S_IMODE(info.st_mode):04o}): "
                   f"`chmod 600 {path}`")
    return path, warning


def environment(key_file: str | Path | None, environ: Mapping[str, str] = os.environ) -> tuple[dict[str, str], str]:
    """The environment for COMMAND (boot folder first on ``PYTHONPATH``, the key file's path), and a warning."""
    env = dict(environ)
    warning = ""
    if key_file is not None:
        path, warning = check_key_file(key_file)
        env[KEY_FILE_VAR] = str(path)
    elif env.get("TRITON_ADMIN_KEY"):
        env.pop(KEY_FILE_VAR, None)
    else:
        raise WithKeyError("no admin key: pass --key-file F (the file `lab-backends serve --admin-key-file F` "
                           "wrote) or set TRITON_ADMIN_KEY")
    env["PYTHONPATH"] = boot_pythonpath(env)
    return env, warning


def boot_pythonpath(environ: Mapping[str, str]) -> str:
    """``environ``'s ``PYTHONPATH`` with the boot folder first (its ``sitecustomize`` runs in every Python)."""
    return os.pathsep.join([str(BOOT_DIR), *filter(None, [environ.get("PYTHONPATH", "")])])


def command_line(command: Sequence[str]) -> list[str]:
    """COMMAND without argparse's leading ``--``; refused when empty or not found."""
    command = list(command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise WithKeyError("no command: lab-backends with-key --key-file F -- python your_client.py ARGS")
    # A path is left to exec, which says why it cannot run it (cli._with_key). Checking it here with access(2)
    # refused what exec runs: nobody's venv python, a link into a folder only root may list.
    found = os.path.lexists(command[0]) if os.sep in command[0] else shutil.which(command[0]) is not None
    if not found:
        raise WithKeyError(f"{command[0]!r} is not a command found on PATH (nor an executable file); "
                           "run a script as `python script.py`")
    return command
