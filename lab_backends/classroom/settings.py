"""What a class on one machine is made of: its ports, folders and names, and the hub's config file.

One frozen dataclass (:class:`ClassSettings`) is the seam between the supervisor that starts
things, the hub config it writes, the spawner that reads that config inside JupyterHub, and the
tests. The hub's ``jupyterhub_config.py`` is *generated* from it (never edited by hand), into a
state folder only root can read: it names the shared Triton's URLs but never its admin key.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab_backends.classroom.cgroups import LearnerLimits
from lab_backends.paths import BUILD_DIR, PROJECT_ROOT
from lab_backends.server.admin import CLASS_RESTRICTED  # noqa: F401 - the class's restricted APIs, named here too

#: The models the lessons that use a shared server need: 01 (cost_model, echo), 05, 08.
CLASS_MODELS = ("cost_model", "echo", "digits_onnx", "digits_torch", "stream_topk", "running_mean")
#: configurable-http-proxy, pinned: 5.2.0 is the newest whose dependencies run on Node 20
#: (5.3.0 pulls commander 15, which asks for Node >= 22.12).
PROXY_VERSION = "5.2.0"
PROXY_DIR = BUILD_DIR / "class-proxy"
PROXY_BIN = PROXY_DIR / "node_modules" / ".bin" / "configurable-http-proxy"
#: PID 1 of each learner's namespace (spawner.py says why): the ``class`` extra installs it next to Python.
DUMB_INIT = Path(sys.executable).parent / "dumb-init"
STATE_DIR = BUILD_DIR / "class"


@dataclass(frozen=True)
class ClassSettings:
    """Everything the supervisor, the hub config and the spawner must agree on."""

    hub_port: int                      #: the learners' URL: http://<hub_ip>:<hub_port>/
    hub_api_port: int                  #: the hub's own API (the proxy and single-user servers call it)
    proxy_api_port: int                #: configurable-http-proxy's REST API
    triton_ports: tuple[int, int, int]  #: HTTP, gRPC, metrics of the shared Triton
    group: str = "lab-class"           #: the Unix group of the class's learners: only they may log in
    hub_ip: str = "127.0.0.1"
    models: tuple[str, ...] = CLASS_MODELS
    state_dir: Path = STATE_DIR        #: 0700 root: hub database, cookie secret, admin key, logs, PIDs
    authenticator: str = "pam"         #: "pam" (real Unix passwords) or "dummy" (tests: one shared password)
    dummy_password: str = field(default="", repr=False)
    notebooks_dir: Path = PROJECT_ROOT / "notebooks"
    #: Extra environment for the learners' servers (tests: JupyterLab settings); never the admin key.
    learner_env: tuple[tuple[str, str], ...] = ()
    #: Each learner's cgroup limits (memory, processes and threads, CPU weight, connections relayed): cgroups.py.
    limits: LearnerLimits = LearnerLimits()

    @property
    def triton_http(self) -> str:
        return f"127.0.0.1:{self.triton_ports[0]}"

    @property
    def hub_url(self) -> str:
        return f"http://{self.hub_ip}:{self.hub_port}"

    @property
    def key_file(self) -> Path:
        return self.state_dir / "admin-key"

    @property
    def learners_secret_file(self) -> Path:
        """The secret each learner's door token is made from (``lab_backends.learner``): root only."""
        return self.state_dir / "learners.secret"

    @property
    def config_file(self) -> Path:
        return self.state_dir / "jupyterhub_config.py"

    @property
    def settings_file(self) -> Path:
        return self.state_dir / "settings.json"

    def triton_env(self) -> dict[str, str]:
        """What a learner's server gets: where the shared Triton is (``remote.py`` reads these), no key."""
        http, grpc, metrics = self.triton_ports
        return {"TRITON_URL": f"http://127.0.0.1:{http}", "TRITON_GRPC_URL": f"127.0.0.1:{grpc}",
                "TRITON_METRICS_URL": f"http://127.0.0.1:{metrics}/metrics", **dict(self.learner_env)}

    def to_json(self) -> str:
        data = asdict(self)
        data.update(state_dir=str(self.state_dir), notebooks_dir=str(self.notebooks_dir), dummy_password="")
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "ClassSettings":
        data = json.loads(text)
        data.update(state_dir=Path(data["state_dir"]), notebooks_dir=Path(data["notebooks_dir"]),
                    triton_ports=tuple(data["triton_ports"]), models=tuple(data["models"]),
                    learner_env=tuple(tuple(p) for p in data["learner_env"]),
                    limits=LearnerLimits(**data.get("limits", {})))
        return cls(**data)


def private_dir(path: Path) -> Path:
    """``path`` created (parents too) and set to 0700: only root reads the hub's secrets and the key."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def hub_config(settings: ClassSettings) -> str:
    """The text of ``jupyterhub_config.py`` for ``settings`` (every value a literal: nothing to import but us)."""
    venv_bin = Path(sys.executable).parent
    auth = (
        "c.JupyterHub.authenticator_class = 'pam'\n"
        f"c.PAMAuthenticator.allowed_groups = {{{settings.group!r}}}\n"
        "c.PAMAuthenticator.open_sessions = False  # no systemd-logind session for a notebook server\n"
        if settings.authenticator == "pam" else
        "c.JupyterHub.authenticator_class = 'dummy'\n"
        f"c.DummyAuthenticator.password = {settings.dummy_password!r}\n"
        "c.Authenticator.allow_all = True  # the spawner still refuses anyone outside the class group\n"
    )
    return f'''# Generated by `lab-backends class start` from {settings.settings_file}: do not edit.
c = get_config()  # noqa: F821
c.JupyterHub.ip = {settings.hub_ip!r}
c.JupyterHub.port = {settings.hub_port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {settings.hub_api_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{settings.proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{str(PROXY_BIN)!r}]
c.JupyterHub.db_url = "sqlite:///{settings.state_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = {str(settings.state_dir / 'cookie_secret')!r}
c.JupyterHub.pid_file = {str(settings.state_dir / 'jupyterhub.pid')!r}
c.JupyterHub.cleanup_servers = True   # stopping the hub stops every learner's server
c.JupyterHub.cleanup_proxy = True
{auth}c.JupyterHub.spawner_class = "lab_backends.classroom.spawner.NamespaceSpawner"
c.NamespaceSpawner.class_group = {settings.group!r}
c.NamespaceSpawner.course_dir = {str(settings.notebooks_dir)!r}
c.NamespaceSpawner.learners_secret_file = {str(settings.learners_secret_file)!r}
c.NamespaceSpawner.outward_ports = {[settings.hub_api_port, *settings.triton_ports]!r}
c.NamespaceSpawner.learner_memory = {settings.limits.memory_bytes}
c.NamespaceSpawner.learner_tasks = {settings.limits.tasks}
c.NamespaceSpawner.learner_cpu_shares = {settings.limits.cpu_shares}
c.NamespaceSpawner.learner_connections = {settings.limits.connections}
c.Spawner.cmd = [{str(venv_bin / 'jupyterhub-singleuser')!r}]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~/notebooks"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {settings.triton_env()!r}
'''
