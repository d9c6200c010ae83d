"""``lab-backends``: the command line behind the README's two commands.

Sub-commands:
  serve         run a real Triton in the foreground until Ctrl-C / SIGTERM
  with-key      ``with-key [--key-file F] -- COMMAND...``: a tritonclient script whose calls carry the admin key
  setup         everything ``make`` does after ``pip install``: backend dir, models, C backends
  build-backends  compile the C backends in c_backends/ (``--force`` rebuilds)
  build-models  train/export the digits and character models into the model folders (``--force`` retrains)
  lab           start JupyterLab on notebooks/ (127.0.0.1, with a token)
  bench         ``bench batching|backends|continuous|door|kvcache [--quick]``: a benchmark -> bench/*.csv, bench/*.png
  plan-class    replicas and per-learner resources for a class (docs/scale.md)
  class         a class on one machine: ``add-learners``, ``start``, ``stop``, ``measure`` (``make class``)
  exercises     ``exercises audit [--only NAME]``: every checker against its skeleton, reference,
                wrong and alternative answers (one line per exercise; ``make test`` runs it)

Deferred imports: ``bench`` and ``exercises`` import their modules when they run; those bring pandas,
matplotlib and every lesson (~0.5 s) that ``--help``, ``serve`` and ``setup`` need not pay.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

from lab_backends import setup_steps
from lab_backends.classroom.command import add_class_parser
from lab_backends.client.with_key import WITH_KEY_DESCRIPTION, command_line, environment
from lab_backends.errors import LabBackendsError
from lab_backends.lessons import handout
from lab_backends.lessons.exercise_command import add_exercises_parser
from lab_backends.measure import class_plan
from lab_backends.paths import MODEL_REPOSITORY, PROJECT_ROOT
from lab_backends.server import admin, bundle, front_door, limits, netns
from lab_backends.server.crash import SERVE_ADVICE, crash_error, crashed
from lab_backends.server.door_share import add_share_arguments, share_limits
from lab_backends.server.ports import free_ports
from lab_backends.server.standby import keep_serving, serving, spare_for
from lab_backends.server.stop_signal import StopRequested, stop_on_sigterm
from lab_backends.server.triton_server import TritonServer


def _serve(args: argparse.Namespace) -> int:
    stop_on_sigterm()
    admin_options = admin.serve_options(args.admin_key_file, args.open_admin_apis, restricted=args.restricted_apis)
    # The door's ports first, then (root) a network namespace of its own for tritonserver, before any thread.
    for flag, given in (("--learner-secret-file shares the front door among learners", args.learner_secret_file),
                        ("--standby puts a second tritonserver behind the front door", args.standby)):
        if given and not args.front_door:
            raise LabBackendsError(f"{flag}: add --front-door")
    secret_file = args.learner_secret_file
    share = front_door.read_fair_share(secret_file, share_limits(args)) if secret_file else None
    ports = netns.public_ports(args.http_port, args.grpc_port, args.metrics_port) if args.front_door else None
    fixed = (None, None, None) if ports else (args.http_port, args.grpc_port, args.metrics_port)
    server = TritonServer(
        args.model_repository or MODEL_REPOSITORY,
        models=args.model or None,
        target="local",
        http_port=fixed[0], grpc_port=fixed[1], metrics_port=fixed[2],
        startup_timeout_s=args.startup_timeout,
        # Only the door reaches an isolated tritonserver: the key is the door's, none on Triton's command line.
        **({**admin_options, "restricted_apis": ()} if ports and ports.isolated else admin_options),
    )
    spare = spare_for(server) if args.standby else None
    with serving(server, spare), contextlib.ExitStack() as stack:
        door = stack.enter_context(front_door.door_for(
            server, ports, front_door.DoorAccess.from_serve_options(admin_options), server.log_path.parent / "door",
            share, standby=spare, restart=args.restart or spare is not None,
        )) if ports else None
        print(f"Triton is ready (pid {server.pid})", flush=True)
        for line in front_door.banner(door, server, spare) if door else [
            f"  HTTP/REST : http://{server.http_url}", f"  gRPC      : {server.grpc_url}",
            f"  metrics   : {server.metrics_url}",
        ]:
            print(line, flush=True)
        print(f"  log       : {server.log_path}", flush=True)
        loaded = ", ".join(args.model) if args.model else "every model of the repository"
        print(f"  models    : {loaded} (explicit model control; `lab-backends serve --help` says how to load others)",
              flush=True)
        if args.open_admin_apis:
            print(admin.OPEN_WARNING, file=sys.stderr, flush=True)
        elif args.admin_key_file:
            admin.write_key_file(args.admin_key_file, server.admin_key)
        print("\n".join([*admin.banner(args.admin_key_file, args.open_admin_apis), "  Ctrl-C stops"]), flush=True)
        try:  # --restart: never gives up, and reloads a model whose Python stub died (stub_health)
            stop_requested = keep_serving(server, spare, args.restart, front_door.servers_file(door),
                                          lambda m: print(m, file=sys.stderr, flush=True))
        except KeyboardInterrupt:
            stop_requested = True
        if not stop_requested:
            code = crashed(server)
            print(crash_error(server, code, advice=SERVE_ADVICE) if code is not None
                  else f"tritonserver stopped serving (log: {server.log_path})", file=sys.stderr, flush=True)
            return 1
    print("stopped", flush=True)
    return 0


def _with_key(args: argparse.Namespace) -> int:
    """Become COMMAND (its exit code, signals, stdin), its tritonclient calls carrying the admin key."""
    command = command_line(args.command)
    env, warning = environment(args.key_file)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"error: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


def _setup(args: argparse.Namespace) -> int:
    b = bundle.find_bundle()
    bundle.check_model_environment()
    bundle.prepare_backend_dir(b)
    print(f"backend directory ready: {bundle.BACKEND_DIR}")
    print("\n".join(setup_steps.build_everything(getattr(args, "force", False), _log)))
    for path in handout.hand_out():
        print(f"handed out: {path.relative_to(PROJECT_ROOT)}")
    return 0


def _log(message: str) -> None:
    print(message, flush=True)


def _build_backends(args: argparse.Namespace) -> int:
    """Compile the C backends in c_backends/ (only stale ones unless --force)."""
    print("\n".join(setup_steps.build_libraries(getattr(args, "force", False))))
    return 0


def _build_models(args: argparse.Namespace) -> int:
    """Train and export the models of set-up, place them in the model folders, install Python backends."""
    print("\n".join(setup_steps.build_models(getattr(args, "force", False), _log)))
    return 0


def _bench(args: argparse.Namespace) -> int:
    """Benchmarks write files (CSV, PNG) and print their tables; they assert nothing."""
    from lab_backends.measure.backend_cost import backends_bench
    from lab_backends.measure.bench import batching_bench
    from lab_backends.measure.door_share import door_bench
    from lab_backends.measure.generation_bench import continuous_bench
    from lab_backends.measure.kv_bench import kv_bench

    run = {"batching": batching_bench, "backends": backends_bench, "continuous": continuous_bench,
           "door": door_bench, "kvcache": kv_bench}[args.name]
    stop_on_sigterm()  # unwind so the bench's server is stopped
    try:
        run(out_dir=args.out, quick=args.quick, log=lambda message: print(message, flush=True))
    except KeyboardInterrupt:
        print("bench interrupted; its server was stopped", file=sys.stderr)
        return 130
    return 0


def _lab(args: argparse.Namespace) -> int:
    """JupyterLab on 127.0.0.1 with a fresh token, printed once so the learner can open it.

    The token travels in ``JUPYTER_TOKEN`` (not on the command line, where ``ps`` shows it).
    SIGTERM and Ctrl-C stop JupyterLab (which shuts its kernels down; their servers' watchdogs
    then stop the Tritons), and JupyterLab also dies if this process is killed.
    """
    token = os.environ.get("LAB_TOKEN") or secrets.token_hex(16)
    port = args.port or free_ports(1)[0]
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--no-browser",
        f"--ServerApp.root_dir={PROJECT_ROOT / 'notebooks'}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {**os.environ, "JUPYTER_TOKEN": token}
    print(f"JupyterLab: http://127.0.0.1:{port}/lab?token={token}", flush=True)
    # JupyterLab gets SIGTERM if this CLI dies, even by SIGKILL (setpriv --pdeathsig; no preexec_fn: limits.py)
    proc = subprocess.Popen([*limits.launch_prefix(die_with_parent=True), *cmd], cwd=PROJECT_ROOT / "notebooks",
                            env=env)
    stop_on_sigterm()
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()  # JupyterLab shuts down cleanly on SIGTERM, kernels included
        try:
            proc.wait(timeout=30)
            return 0  # a requested stop is a clean exit, whatever code JupyterLab chose
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def _plan_class(args: argparse.Namespace) -> int:
    """Simulate a class on the shared Triton from the measured footprint (docs/scale.md)."""
    print(
        class_plan.report(
            class_plan.plan(
                args.learners,
                args.gpu_replicas,
                p99_bound_ms=args.p99_ms,
                stagger_s=args.stagger_s,
                think_s=args.think_s,
                speedup=args.speedup,
                instances=args.instances,
            )
        )
    )
    return 0


def _port(text: str) -> int:
    """A TCP port, checked here so that ``--http-port 70000`` is a one-line error, not a traceback."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port: choose 1-65535 (or leave it out for a free one)")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lab-backends", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", help="run a real Triton in the foreground", description=admin.SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--model-repository", type=Path, help="the models' folder (default: model_repository/)")
    serve.add_argument("--http-port", type=_port)
    serve.add_argument("--grpc-port", type=_port)
    serve.add_argument("--metrics-port", type=_port)
    serve.add_argument("--model", action="append", metavar="NAME",
                       help="load only this model at start (repeatable); the others can be loaded later")
    serve.add_argument("--startup-timeout", type=float, default=180.0)
    serve.add_argument("--restart", action="store_true",
                       help="restart tritonserver after every crash, same ports (after 1 s, doubling with each crash "
                       "in a minute, at most 30 s; it never gives up); reload a model whose Python stub died")
    serve.add_argument(
        "--admin-key-file", type=Path, metavar="F",
        help="write the admin key to F (mode 0600; TRITON_ADMIN_KEY chooses it); see 'admin key' above"
    )
    serve.add_argument(
        "--open-admin-apis", action="store_true",
        help="no admin key at all: anyone who can reach the ports can load models (runs code); prints a warning"
    )
    serve.add_argument("--front-door", action="store_true",
                       help="put Debian's nginx before tritonserver (make door-deps): it takes --http-port and "
                       "--grpc-port, refuses form-encoded bodies, bodies over the served models' largest request "
                       "and names with '..', and checks the admin key itself; tritonserver gets ports of its own")
    serve.add_argument("--standby", action="store_true", help="a second tritonserver behind the front door takes "
                       "over at once when one crashes (implies --restart; twice the memory): docs/reliability.md")
    add_share_arguments(serve)
    serve.add_argument("--restricted-apis", metavar="A,B",
                       help="the APIs behind the key (default: all). A class keeps statistics open: "
                            "model-repository,trace,shared-memory,logging")
    serve.set_defaults(func=_serve)

    with_key = sub.add_parser(
        "with-key", help="run a tritonclient script whose calls carry the admin key",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=WITH_KEY_DESCRIPTION,
    )
    with_key.add_argument("--key-file", type=Path, metavar="F",
                          help="the file `serve --admin-key-file F` wrote (default: the key in TRITON_ADMIN_KEY)")
    with_key.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    with_key.set_defaults(func=_with_key)

    setup = sub.add_parser("setup", help="prepare backends and build models (idempotent)")
    setup.set_defaults(func=_setup)

    build_backends = sub.add_parser("build-backends", help="compile the C backends in c_backends/ with gcc")
    build_backends.add_argument("--force", action="store_true", help="rebuild even if up to date")
    build_backends.set_defaults(func=_build_backends)

    build_models = sub.add_parser("build-models", help="train and export the digits models (idempotent)")
    build_models.add_argument("--force", action="store_true", help="retrain even if up to date")
    build_models.set_defaults(func=_build_models)

    lab = sub.add_parser("lab", help="start JupyterLab on notebooks/")
    lab.add_argument("--port", type=int)
    lab.set_defaults(func=_lab)

    bench = sub.add_parser("bench", help="run a benchmark and write its CSV/PNG files")
    bench.add_argument("name", choices=["batching", "backends", "continuous", "door", "kvcache"],
                       help="which benchmark")
    bench.add_argument("--quick", action="store_true", help="fewer requests per point (under 3 minutes)")
    bench.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench", help="output folder (default: bench/)")
    bench.set_defaults(func=_bench)

    plan_class = sub.add_parser("plan-class", help="plan replicas and learner resources for a class")
    plan_class.add_argument("--learners", type=int, required=True)
    plan_class.add_argument(
        "--gpu-replicas", type=int, help="simulate this many (default: the fewest that meet --p99-ms)"
    )
    plan_class.add_argument("--p99-ms", type=float, default=250.0, help="latency bound for the p99 (default 250)")
    plan_class.add_argument("--stagger-s", type=float, default=600.0, help="learners start within this window")
    plan_class.add_argument("--think-s", type=float, default=120.0, help="pause between notebooks")
    plan_class.add_argument("--speedup", type=float, default=1.0, help="GPU replica speed vs this CPU (default 1)")
    plan_class.add_argument("--instances", type=int, default=1, help="instances per model per replica")
    plan_class.set_defaults(func=_plan_class)

    add_exercises_parser(sub)
    add_class_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    try:
        return args.func(args)
    except LabBackendsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StopRequested:  # SIGTERM before the command had anything to stop
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
