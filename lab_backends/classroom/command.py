"""``lab-backends class ...``: the instructor's commands for a class on one machine (``make class``).

Kept out of ``cli.py`` so that the entry point stays one line per command family; every
sub-command here is a thin call into :mod:`.roster`, :mod:`.supervisor` or
:mod:`lab_backends.measure.class_latency`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from lab_backends.classroom import supervisor
from lab_backends.classroom.cgroups import GIB, LearnerLimits
from lab_backends.classroom.roster import add_learners, read_roster, remove_learners, write_credentials
from lab_backends.classroom.sandboxed_replay import SandboxedReplay
from lab_backends.classroom.settings import CLASS_MODELS, STATE_DIR, ClassSettings, private_dir
from lab_backends.classroom.supervisor import ClassError
from lab_backends.measure import class_latency
from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.ports import free_ports

CLASS_DESCRIPTION = """\
A class on one machine: one shared Triton (its admin key hidden from learners), JupyterHub on
127.0.0.1, one Unix account per learner (all in one group), each learner's JupyterLab run as that
learner in a PID namespace of its own, the course notebooks copied into their home.

  lab-backends class add-learners roster.txt   # accounts (as root); passwords -> build/class/credentials.txt
  lab-backends class start                     # Triton + hub in the foreground; Ctrl-C stops everything
  lab-backends class stop                      # from another terminal (make class-stop)
  lab-backends class remove-learners roster.txt
  lab-backends class measure                   # latency with 1, 3, 6 learners vs plan-class (docs/scale.md)"""


def _start(args: argparse.Namespace) -> int:
    hub_api, proxy_api, *triton = free_ports(5)
    env = tuple(tuple(item.split("=", 1)) for item in args.learner_env or ())
    settings = ClassSettings(
        hub_port=args.hub_port, hub_api_port=hub_api, proxy_api_port=proxy_api, triton_ports=tuple(triton),
        group=args.group, models=tuple(args.model or CLASS_MODELS), state_dir=args.state_dir,
        authenticator=args.authenticator, dummy_password=_dummy_password(args.authenticator), learner_env=env,
        limits=LearnerLimits(int(args.learner_memory * GIB), args.learner_tasks, args.learner_cpu_shares),
    )
    running = supervisor.start(settings)
    return supervisor.supervise(running, settings)


def _dummy_password(authenticator: str) -> str:
    if authenticator != "dummy":
        return ""
    password = os.environ.get("LAB_CLASS_PASSWORD", "")
    if len(password) < 8:
        raise ClassError("--authenticator dummy (tests only) needs LAB_CLASS_PASSWORD of 8 characters or more: "
                         "every learner logs in with it")
    return password


def _stop(args: argparse.Namespace) -> int:
    return supervisor.stop_running(args.state_dir)


def _add(args: argparse.Namespace) -> int:
    learners = add_learners(read_roster(args.roster), args.group)
    out = write_credentials(learners, private_dir(args.state_dir) / "credentials.txt")
    print(f"{len(learners)} learner(s) in group {args.group}; their passwords are in {out} (root only): hand them out")
    return 0


def _remove(args: argparse.Namespace) -> int:
    removed = remove_learners([learner.name for learner in read_roster(args.roster)], args.group)
    print(f"{len(removed)} account(s) removed with their homes")
    return 0


def _measure(args: argparse.Namespace) -> int:
    counts = [int(n) for n in args.learners.split(",")]
    sandboxed = SandboxedReplay(LearnerLimits()) if args.sandboxed else None
    result = class_latency.measure(counts, args.notebooks.split(","), out=args.out, sandboxed=sandboxed)
    print(class_latency.report(result))
    return 0


def add_class_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("class", help="a class on one machine: learners, shared Triton, JupyterHub",
                            description=CLASS_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--group", default="lab-class", help="the learners' Unix group (default lab-class)")
    common.add_argument("--state-dir", type=Path, default=STATE_DIR, help=f"root-only state (default {STATE_DIR})")

    start = actions.add_parser("start", parents=[common], help="shared Triton + JupyterHub, in the foreground")
    start.add_argument("--hub-port", type=int, default=8000, help="the learners' URL port on 127.0.0.1 (default 8000)")
    start.add_argument("--model", action="append", metavar="NAME",
                       help="a model of the shared Triton (repeatable; default: those of lessons 01, 05, 08)")
    start.add_argument("--authenticator", choices=["pam", "dummy"], default="pam",
                       help="pam: the learners' Unix passwords (default); dummy: tests only, LAB_CLASS_PASSWORD")
    start.add_argument("--learner-env", action="append", metavar="K=V", help="extra environment for learners' servers")
    defaults = LearnerLimits()
    start.add_argument("--learner-memory", type=float, metavar="GIB", default=defaults.memory_bytes / GIB,
                       help=f"GiB per learner, all their processes together (default {defaults.memory_bytes / GIB:g})")
    start.add_argument("--learner-tasks", type=int, metavar="N", default=defaults.tasks,
                       help=f"processes and threads per learner (default {defaults.tasks})")
    start.add_argument("--learner-cpu-shares", type=int, metavar="W", default=defaults.cpu_shares,
                       help=f"each learner's CPU weight (default {defaults.cpu_shares}: all learners equal)")
    start.set_defaults(func=_start)

    stop = actions.add_parser("stop", parents=[common], help="stop the class that `class start` runs")
    stop.set_defaults(func=_stop)
    for name, func, what in (("add-learners", _add, "create"), ("remove-learners", _remove, "delete")):
        action = actions.add_parser(name, parents=[common], help=f"{what} the Unix accounts of a roster (root)")
        action.add_argument("roster", type=Path, help="one learner a line: 'name' or 'name password'")
        action.set_defaults(func=func)

    measure = actions.add_parser("measure", help="shared-server latency for N learners vs plan-class")
    measure.add_argument("--learners", default="1,3,6", help="learner counts (default 1,3,6)")
    measure.add_argument("--notebooks", default="01_rest_and_grpc", help="whose recorded requests to replay")
    measure.add_argument("--sandboxed", action="store_true",
                         help="also replay each learner from a class sandbox (network namespace, limits; root)")
    measure.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "scale" / "one_machine.json")
    measure.set_defaults(func=_measure)
