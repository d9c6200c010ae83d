"""How tests/class acts as a learner: inside their server's namespaces and cgroups, and inside their kernel.

A learner's code runs in their server's PID, mount and network namespaces, in their cgroups, as
their Unix user, with their server's environment (the door token, ``TRITON_URL``, ``PYTHONSTARTUP``).
:func:`as_learner` runs a probe exactly there; :func:`in_kernel` runs code in the learner's real
IPython kernel (their JupyterLab's), through its connection file, the way a notebook cell runs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil

from lab_backends.classroom import cgroups
from lab_backends.classroom.network import NETNS_DIR, namespace_name

ROOT = Path(__file__).resolve().parents[2]
PY = ROOT / ".venv" / "bin" / "python"


def server_environ(pid: int) -> dict[str, str]:
    """The environment of a learner's single-user server: what their kernels and terminals inherit."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def learner_command(name: str, server: int, code: str, *args: str) -> dict:
    """``subprocess`` arguments that run Python ``code`` as ``name`` in the namespaces (PID, mount, network) and
    cgroups of their server ``server``, with its environment."""
    enter = ["nsenter", f"--target={server}", "--pid", "--mount", "--net", "--"]
    drop = ["setpriv", f"--reuid={name}", f"--regid={name}", "--init-groups", "--"]
    env = server_environ(server)
    return {"args": [*cgroups.join_command(cgroups.learner_groups(name)), *enter, *drop, str(PY), "-c", code, *args],
            "env": env,
            "cwd": env.get("HOME", "/"), "text": True}


def as_learner(name: str, server: int, code: str, *args: str, stdin: str = "", timeout_s: float = 120,
               check: bool = True) -> subprocess.CompletedProcess:
    """Python ``code`` run to its end as ``name``, where their kernels run (:func:`learner_command`)."""
    done = subprocess.run(**learner_command(name, server, code, *args), input=stdin, capture_output=True,
                          timeout=timeout_s)
    if check:
        assert done.returncode == 0, f"as {name}: exit {done.returncode}\n{done.stdout[-1000:]}\n{done.stderr[-2000:]}"
    return done


#: Runs in the learner's network namespace (as root: it reads their connection file): one cell in their kernel.
_CELL = """
import json, sys
from jupyter_client import BlockingKernelClient
client = BlockingKernelClient(connection_file=sys.argv[1])
client.load_connection_file()
client.start_channels()
out = {"stdout": "", "stderr": "", "status": "no reply"}
try:
    msg_id = client.execute(sys.stdin.read())
    reply = client.get_shell_msg(timeout=float(sys.argv[2]))
    out["status"] = reply["content"]["status"]
    while True:
        msg = client.get_iopub_msg(timeout=5)
        kind, content = msg["msg_type"], msg["content"]
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if kind == "stream":
            out[content["name"]] += content["text"]
        elif kind == "status" and content["execution_state"] == "idle":
            break
except Exception as exc:  # a kernel that died mid-cell sends no reply: say so
    out["error"] = f"{type(exc).__name__}: {exc}"
finally:
    client.stop_channels()
print(json.dumps(out))
"""


def kernel_files(name: str) -> list[Path]:
    """The learner's kernels' connection files, newest last."""
    home = Path(f"~{name}").expanduser()
    return sorted((home / ".local" / "share" / "jupyter" / "runtime").glob("kernel-*.json"),
                  key=lambda p: p.stat().st_mtime)


def kernel_pid(name: str, connection: Path) -> int | None:
    """The PID of the kernel process started with ``connection`` (its ``-f`` argument)."""
    for proc in psutil.process_iter(["username", "cmdline"]):
        if proc.info["username"] == name and str(connection.name) in " ".join(proc.info["cmdline"] or []):
            return proc.pid
    return None


def in_kernel(name: str, connection: Path, code: str, timeout_s: float = 60) -> dict:
    """Run ``code`` as one cell in the learner's kernel; its stdout, stderr and status (or the error)."""
    netns = NETNS_DIR / namespace_name(name)
    done = subprocess.run(["nsenter", f"--net={netns}", "--", str(PY), "-c", _CELL, str(connection), str(timeout_s)],
                          input=code, capture_output=True, text=True, timeout=timeout_s + 30)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def kernel_ports(connection: Path) -> list[int]:
    info = json.loads(connection.read_text())
    return [int(info[k]) for k in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")]
