"""The roster file and the learners' Unix accounts (``lab-backends class add-learners|remove-learners``).

Why real accounts: the spawner runs each learner's JupyterLab *as that learner*, so the kernel's
file permissions are the machine's own (a learner cannot read another's home, nor root's key
file), and PAM can check their passwords. Every account of the class is in one Unix group
(``lab-class`` by default): the hub lets only that group in, and ``remove-learners`` deletes only
accounts of that group, never someone else's.

A roster is a text file, one learner a line: ``name`` (a password is generated) or
``name password``; ``#`` starts a comment. Names are checked like ``useradd`` checks them, and a
bad line is one error with its line number and the fix. Accounts get ``/usr/sbin/nologin`` as
their shell: the hub is the only way in (a JupyterLab terminal still gets bash).
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import psutil

from lab_backends.errors import LabBackendsError
from lab_backends.server.processes import stop_processes

#: ``useradd``'s default NAME_REGEX (Debian), and a length every tool handles.
_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
NOLOGIN = "/usr/sbin/nologin"


class RosterError(LabBackendsError):
    """A roster line, an account or the caller (not root) that cannot be used; the message says the fix."""


@dataclass(frozen=True)
class Learner:
    """One roster line: the Unix name, and the password to set (generated when the line has none)."""

    name: str
    password: str
    line: int = 0


def parse_roster(text: str, source: str = "roster") -> list[Learner]:
    """The learners of a roster's text; :class:`RosterError` names the first bad line and how to fix it."""
    learners: list[Learner] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        where = f"{source}, line {number} ({raw.strip()!r})"
        if len(parts) > 2:
            raise RosterError(f"{where}: expected 'name' or 'name password'; passwords cannot hold spaces")
        name = parts[0]
        if not _NAME.match(name):
            raise RosterError(f"{where}: {name!r} is not a Unix user name: use lower-case letters, digits, "
                              "'_' or '-', starting with a letter or '_', at most 32 characters")
        if name in seen:
            raise RosterError(f"{where}: {name} is listed twice (first on line {seen[name]}): keep one line")
        if len(parts) == 2 and len(parts[1]) < 8:
            raise RosterError(f"{where}: the password is shorter than 8 characters: give a longer one, "
                              "or leave it out and one is generated")
        seen[name] = number
        learners.append(Learner(name, parts[1] if len(parts) == 2 else secrets.token_urlsafe(9), number))
    if not learners:
        raise RosterError(f"{source} names no learner: write one user name per line")
    return learners


def read_roster(path: Path) -> list[Learner]:
    try:
        return parse_roster(path.read_text(), str(path))
    except OSError as exc:
        raise RosterError(f"cannot read the roster {path}: {exc.strerror or exc}") from exc


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise RosterError(f"{what} needs root (it manages Unix accounts and drops to each learner): "
                          f"run it as root, e.g. `sudo .venv/bin/lab-backends class ...`")


def _run(cmd: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if done.returncode:
        raise RosterError(f"{' '.join(cmd[:2])} ... failed ({done.returncode}): {done.stderr.strip()[-300:]}")


def ensure_group(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        _run(["groupadd", "--system", group])
        return grp.getgrnam(group).gr_gid


def add_learners(learners: Iterable[Learner], group: str, say: Callable[[str], None] = print) -> list[Learner]:
    """Create each learner's account (home 0700, group ``group``, nologin) and set its password.

    An account that exists already is refused unless it is in ``group`` (then only its password is
    set again): the roster must never take over somebody's account.
    """
    require_root("class add-learners")
    ensure_group(group)
    learners = list(learners)
    for learner in learners:
        try:
            pwd.getpwnam(learner.name)
            exists = True
        except KeyError:
            exists = False
        if exists and learner.name not in grp.getgrnam(group).gr_mem:
            raise RosterError(f"line {learner.line}: the account {learner.name} exists and is not a learner of this "
                              f"class (group {group}): choose another name, or add it to the group on purpose "
                              f"(`usermod -aG {group} {learner.name}`)")
        if not exists:
            _run(["useradd", "--create-home", "--shell", NOLOGIN, "--user-group", "--groups", group, learner.name])
            os.chmod(pwd.getpwnam(learner.name).pw_dir, 0o700)
            say(f"created {learner.name}")
    _run(["chpasswd"], "".join(f"{learner.name}:{learner.password}\n" for learner in learners))
    return learners


def remove_learners(names: Iterable[str], group: str, say: Callable[[str], None] = print) -> list[str]:
    """Delete these accounts with their homes, only those of ``group``; returns the names removed."""
    require_root("class remove-learners")
    removed = []
    for name in names:
        try:
            members = grp.getgrnam(group).gr_mem
            pwd.getpwnam(name)
        except KeyError:
            continue
        if name not in members:
            raise RosterError(f"{name} is not in the class group {group}: not removed (it is not this class's account)")
        kill_processes_of(pwd.getpwnam(name).pw_uid)
        _run(["userdel", "--remove", name])
        removed.append(name)
        say(f"removed {name}")
    return removed


def processes_of(uid: int) -> list[psutil.Process]:
    """Every process running as ``uid`` (a learner's: the class started them all)."""
    found = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and uid in (uids.real, uids.effective):
            found.append(proc)
    return found


def kill_processes_of(uid: int, grace_s: float = 5.0) -> int:
    """SIGTERM, then SIGKILL, each process of a learner's account, by PID; returns how many there were."""
    procs = processes_of(uid)
    stop_processes(procs, grace_s)
    return len(procs)


def write_credentials(learners: Iterable[Learner], path: Path) -> Path:
    """``name password`` lines for the instructor to hand out, in a file only root reads (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.writelines(f"{learner.name} {learner.password}\n" for learner in learners)
    return path
