"""A class on one machine, end to end: three learners, one shared Triton, a real hub and a real browser.

The class is the README's: its instructors' commands, run as written through sudo (conftest.py), the first test
says so and the last one stops it with the README's ``sudo make class-stop``.
Three learners log in concurrently (three Chromium contexts, PAM with their Unix passwords) and run
lesson 01 in their own JupyterLab, all at once, against the shared Triton; its statistics must
count all three learners' requests. Then, as each learner, from inside their server's PID
namespace (where their kernels and terminals run): the admin key cannot be read from the key file,
from any process's command line or environment. One learner's session cannot open another's
server. Last, ``make class-stop`` must leave no process of the class, no port it listened on and no
``/dev/shm`` region of its servers.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from adversary_checks import adversary
from browser.test_lab_in_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_FLAGS,
    _kernel_idle,
    _no_errors,
    _run_menu,
    _wait,
    answer_dialog,
)
from connection_checks import learner_connections
from sandbox_checks import fork_bomb_and_memory_hog, isolation, sequences_apart
from sandbox_probes import as_learner

from lab_backends import rest
from lab_backends.classroom import cgroups
from lab_backends.classroom.network import NETNS_DIR, SOCKET_ROOT, namespace_name
from lab_backends.server.endpoints import statistics_payload
from lab_backends.server.ports import port_is_free
from lab_backends.server.processes import SHM_DIR, shm_regions
from lab_backends.waiting import poll
from tests.nvidia_examples import example_source
from tests.reliability.test_front_door import AS_UNPRIVILEGED, REFUSED_AND_READY
from tests.test_with_key import REFUSED

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "01_rest_and_grpc.ipynb"
#: What one run of lesson 01 sends to cost_model (two hand-made exchanges, two tritonclient calls, one binary
#: request: the notebook's sections 1-2); echo gets the latency comparison. Checked exactly: three learners, 3x.
COST_MODEL_PER_LEARNER = 5
RUN_DEADLINE_S = 240

pytestmark = [pytest.mark.server, pytest.mark.slow]


def _success(room: Any, model: str) -> int:
    payload = statistics_payload(room.triton_http, model, {"admin-key": room.key})
    return int(payload["model_stats"][0]["inference_stats"]["success"]["count"])


def _login(browser: Any, room: Any, name: str) -> tuple[Any, Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{room.hub_url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", room.learners[name])
    page.click("#login_submit")
    return context, page


#: Lesson 01 runs to its end: every cell above its last one, ``server.stop()`` (on a shared server that
#: only closes the learner's clients). Its shared-memory section starts the learner's own embedded
#: Triton (the shared server cannot map their /dev/shm, and that API is behind the key); the rest talks
#: to the shared server.
STOP_AT = "server.stop()"


def _open_and_run(page: Any, room: Any, name: str) -> Any:
    """Wait for the learner's lab, open lesson 01 (their own copy), run every cell above :data:`STOP_AT`."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.wait_for_url(f"**/user/{name}/lab**", timeout=120_000)
    page.locator("#jp-main-dock-panel").wait_for(timeout=90_000)  # this JupyterLab is up before the next one loads
    page.goto(f"{room.hub_url}/user/{name}/lab/tree/{NOTEBOOK}")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=90_000)
    _wait(f"{name}'s kernel", lambda: _kernel_idle(page), 90)
    stop_cell = page.locator(".jp-CodeCell", has_text=STOP_AT).last
    first_prompt = page.locator(".jp-CodeCell .jp-InputPrompt").first
    dialogs: list[str] = []
    for attempt in range(3):
        answer_dialog(page, dialogs)
        try:
            stop_cell.locator(".jp-InputPrompt").click(timeout=15_000)
            _run_menu(page, "Run All Above Selected Cell")
            _wait("the first cell to start", lambda: first_prompt.inner_text().strip() not in ("[ ]:", ""), 20)
            break
        except (AssertionError, PlaywrightTimeout) as exc:
            if attempt == 2:
                raise AssertionError(f"{name}'s lesson did not start; dialogs seen: {dialogs or 'none'}") from exc
    if dialogs:
        print(f"{name}'s lab showed dialogs before the run started: {dialogs}")
    return stop_cell


def _ran_all(page: Any) -> bool:
    """No error, the kernel idle, and every code cell above :data:`STOP_AT` numbered (it ran)."""
    _no_errors(page)
    prompts = [p.strip() for p in page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()]
    codes = page.locator(".jp-CodeCell").all_inner_texts()
    upto = max(i for i, text in enumerate(codes) if STOP_AT in text)  # the last cell: `shm_server.stop()` also matches
    return _kernel_idle(page) and all(p[1:-2].isdigit() for p in prompts[:upto])


def test_the_class_runs_by_the_readmes_own_commands(classroom: Any) -> None:
    """``sudo make setup``, ``sudo .venv/bin/lab-backends class add-learners roster.txt`` and ``sudo make class``, as
    the README writes them (only the test's options after each), made this class: the first two exited 0, and
    the class's supervisor runs under ``make class`` under sudo, after the venv was compiled ahead (the step that
    once stopped ``make class``: compileall's exit 1 on a torch file Python 3.11 cannot compile)."""
    room = classroom
    readme = room.readme
    assert [c.split()[:3] for c in readme] == [["sudo", "make", "setup"], ["sudo", ".venv/bin/lab-backends", "class"],
                                               ["sudo", "make", "class"], ["sudo", "make", "class-stop"]], readme
    run = [line for line, _ in room.ran]
    assert len(run) == 3 and all(line.startswith(f"{command} ") or line == command
                                 for line, command in zip(run, readme)), (run, readme)
    assert [status for _, status in room.ran] == [0, 0, None], room.ran
    supervisor = psutil.Process(json.loads((room.state_dir / "pids.json").read_text())["supervisor"])
    assert "class start" in " ".join(supervisor.cmdline()), supervisor.cmdline()
    above = [p.name() for p in supervisor.parents()]  # nearest first: make (perhaps its shell), then sudo
    assert "make" in above[:2] and "sudo" in above[above.index("make") + 1:above.index("make") + 3], above
    assert psutil.Process(room.proc.pid).name() == "sudo", "the class was not started by `sudo make class`"
    log = room.log.read_text()
    compiled = [line for line in log.splitlines() if line.startswith("precompile: ")]
    assert len(compiled) == 1 and " Python files up to date in " in compiled[0], log[-3000:]
    assert log.index(compiled[0]) < log.index("the class runs"), "the class started before the venv was compiled"


def test_three_learners_run_lesson_01_on_the_shared_server(classroom: Any) -> None:
    from playwright.sync_api import sync_playwright

    room = classroom
    before = {m: _success(room, m) for m in ("cost_model", "echo")}
    started = time.monotonic()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        try:
            sessions = {name: _login(browser, room, name) for name in room.learners}  # three logins at once
            for name, (_, page) in sessions.items():
                _open_and_run(page, room, name)
            for name, (_, page) in sessions.items():  # all three run at the same time; wait for each
                _wait(f"{name}'s lesson 01 to run", lambda page=page: _ran_all(page), RUN_DEADLINE_S, every_s=1.0)
                first_output = page.locator(".jp-OutputArea-output").first.inner_text()
                assert f"<TritonServer remote http={room.triton_http}" in first_output, \
                    f"{name}'s lesson did not use the shared Triton: {first_output[:300]}"
                outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
                assert "starting an embedded one for this section" in outputs and \
                    "unregistered and destroyed" in outputs, \
                    f"{name}'s shared-memory section did not run on their own Triton: {outputs[-1500:]}"
            room.remember()

            # Another learner's server: a's session on b's URL is refused by the hub (403), b's lab never shows.
            a, b = list(room.learners)[:2]
            page = sessions[a][1]
            response = page.goto(f"{room.hub_url}/user/{b}/lab")
            assert response is not None and response.status == 403, \
                f"{a} opened /user/{b}/lab: HTTP {response and response.status}, {page.url}"
            assert page.locator(".jp-NotebookPanel").count() == 0
            api = sessions[a][0].request.get(f"{room.hub_url}/user/{b}/api/contents", max_redirects=0)
            assert api.status in (302, 403) and api.status != 200, f"{a} read {b}'s files: HTTP {api.status}"
        except BaseException:
            for name, (_, page) in locals().get("sessions", {}).items():
                page.screenshot(path=str(ARTIFACTS / f"class-{name[-1]}-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    after = {m: _success(room, m) for m in ("cost_model", "echo")}
    # The door knew whose requests they were: the hub gave each learner's server its token, and the kernels'
    # tritonclient and rest calls carried it (every name in the door's log is a learner whose token matched).
    logged = _door_access_log(room).read_text().splitlines()
    for name in room.learners:
        assert any(f"learner={name} " in line and "infer" in line.lower() for line in logged), \
            f"the front door's log names no inference of {name}'s: {logged[-20:]}"
    n = len(room.learners)
    assert after["cost_model"] - before["cost_model"] == n * COST_MODEL_PER_LEARNER, (before, after)
    assert after["echo"] - before["echo"] >= n * 2, (before, after)
    print(f"three learners ran lesson 01 in {time.monotonic() - started:.0f} s; shared server: {before} -> {after}")


def test_learners_cannot_reach_each_others_kernels_servers_or_shared_memory(classroom: Any) -> None:
    """#38: C cannot connect to A's kernel ports or to a port A listens on (their embedded Triton's, say), nor
    see A's /dev/shm regions; A can (the control). Every learner's server runs with umask 077."""
    isolation(classroom, _learner_servers(classroom))


def test_a_learners_fork_bomb_and_memory_hog_stop_at_their_limits_while_the_others_work(classroom: Any) -> None:
    """#38: in C's own kernel, a fork bomb is refused at C's task limit and a 6 GiB array is stopped by C's
    memory limit (the kernel restarts), each within 30 s, each explained in one line in C's next output;
    A's and B's requests to the shared server succeed throughout."""
    fork_bomb_and_memory_hog(classroom, _learner_servers(classroom))


def test_learners_sequences_cannot_touch_each_others_state(classroom: Any) -> None:
    """#38: B and C both use sequence ID 7 through the lessons' helpers: B's running mean is B's alone."""
    sequences_apart(classroom, _learner_servers(classroom))


#: Lesson 09b's first build, as the learner runs it (``batch_strategy.build(SCRATCH_DIR / "notebook09b")``), and
#: whether build/ (the instructor's) would have taken it: it must not, which is why lessons write to SCRATCH_DIR.
_BUILDS = """
import os
from lab_backends.lessons import batch_strategy
from lab_backends.paths import BUILD_DIR, SCRATCH_DIR
library = batch_strategy.build(SCRATCH_DIR / "notebook09b")
print(library.is_file() and library.is_relative_to(os.environ["HOME"]), os.access(BUILD_DIR, os.W_OK))
"""


def test_a_learner_builds_lesson_09bs_strategy_in_a_folder_of_their_own(classroom: Any) -> None:
    """#38: lessons 09 and 09b build C libraries as they run; build/ is not the learner's to write, so they
    build under SCRATCH_DIR, which the spawner points into the learner's home (``LAB_SCRATCH_DIR``)."""
    servers = _learner_servers(classroom)
    assert servers, "no learner's server runs: the lesson 01 test starts them"
    name, server = next(iter(servers.items()))
    mine, build_writable = as_learner(name, server, _BUILDS).stdout.split()
    assert mine == "True", f"{name}'s lesson 09b build did not land in their home"
    assert build_writable == "False", "the control: a learner cannot write into build/"


_PROBE = """
import os, sys
key = sys.stdin.read().strip()
found = []
try:
    open(sys.argv[1]).read()
    found.append('key file readable')
except PermissionError:
    pass
pids = [p for p in os.listdir('/proc') if p.isdigit()]
for pid in pids:
    for what in ('cmdline', 'environ'):
        try:
            if key.encode() in open(f'/proc/{pid}/{what}', 'rb').read():
                found.append(f'/proc/{pid}/{what}')
        except OSError:
            pass
if key in ''.join(os.environ.values()):
    found.append('environment')
print(len(pids), ';'.join(found) or 'none')
"""


def _probe(room: Any, name: str, namespace_of: int) -> tuple[int, str]:
    """Run :data:`_PROBE` as ``name`` inside their server's namespaces: (processes seen, where the key was found)."""
    count, found = as_learner(name, namespace_of, _PROBE, str(room.state_dir / "admin-key"),
                              stdin=room.key).stdout.split()
    return int(count), found


def test_learners_cannot_read_the_admin_key(classroom: Any) -> None:
    room = classroom
    for name in room.learners:
        server = [p for p in psutil.process_iter(["username", "cmdline"])
                  if p.info["username"] == name and any("jupyterhub-singleuser" in a for a in p.info["cmdline"] or [])]
        assert server, f"{name} has no running server"
        init = [p for p in server if p.name() == "dumb-init"]  # PID 1 of the namespace: it reaps orphans
        assert len(init) == 1 and init[0].children(), f"{name}'s server does not run under dumb-init: {server}"
        count, found = _probe(room, name, server[0].pid)
        assert found == "none", f"{name} read the admin key from {found}"
        assert count < 30, f"{name} sees {count} processes: not their own namespace"
    # Not even on the machine's own /proc (no hub session gives a learner this): the shared tritonserver runs in
    # a network namespace of its own behind the front door, with no key on its command line (serve as root).
    triton = _shared_triton(room)
    assert triton, "the shared tritonserver was not found"
    name = next(iter(room.learners))
    host = subprocess.run(["setpriv", f"--reuid={name}", f"--regid={name}", "--init-groups", "--", "ps", "-eo", "args"],
                          capture_output=True, text=True, timeout=30)
    assert host.returncode == 0 and "tritonserver" in host.stdout, host.stderr  # the control: ps sees it
    assert room.key not in host.stdout, "the admin key is on a command line of this machine"


def test_a_learner_cannot_crash_or_reach_the_shared_tritonserver(classroom: Any) -> None:
    """As a learner, in their namespaces: Triton 2.51's crashing POST (4 MiB, form-encoded) five times, each
    refused by the door (415) with the server ready after it and the same tritonserver throughout; and
    tritonserver's own ports, which only the door reaches (its network namespace), refused."""
    room = classroom
    before = _shared_triton(room)
    assert before, "the shared tritonserver was not found"
    args = psutil.Process(before).cmdline()
    own = [a.split("=", 1)[1] for a in args if a.startswith(("--http-port=", "--grpc-port="))]
    assert len(own) == 2, args
    name, server = next(iter(_learner_servers(room).items()))
    answers, reached, _, _, found = as_learner(name, server, AS_UNPRIVILEGED, room.triton_http, *own,
                                               stdin=room.key).stdout.split()
    assert answers == REFUSED_AND_READY, answers
    assert reached == "none", f"{name} connected to tritonserver's own ports {reached}"
    assert found == "False", f"{name} read the admin key"
    assert _shared_triton(room) == before, "the shared tritonserver was restarted: the POST reached it"


#: Runs one of NVIDIA's examples, its source on stdin, as its own ``__main__`` with ``-u`` the address given.
AN_EXAMPLE = """
import sys
source, sys.argv = sys.stdin.read(), ["example.py", "-u", sys.argv[1]]
exec(compile(source, "example.py", "exec"), {"__name__": "__main__"})
"""


def test_nvidias_unchanged_admin_examples_are_refused_to_a_learner(classroom: Any) -> None:
    """A learner holds no key: NVIDIA's model-control examples, unchanged (their first call, the repository
    index, is an admin API), are refused by the class's door in its own words, over HTTP and over gRPC."""
    room = classroom
    http, grpc, _ = room.settings()["triton_ports"]
    name, server = next(iter(_learner_servers(room).items()))
    for example, port, protocol in (("simple_http_model_control", http, "http"),
                                    ("simple_grpc_model_control", grpc, "grpc")):
        done = as_learner(name, server, AN_EXAMPLE, f"127.0.0.1:{port}", stdin=example_source(example).decode(),
                          check=False)
        assert done.returncode != 0 and REFUSED["front door"][protocol] in done.stderr, (
            f"{example} as {name}: exit {done.returncode}\n{done.stdout[-1000:]}\n{done.stderr[-2000:]}")


def _door_access_log(room: Any) -> Path:
    """The class door's access log, as the shared Triton's ``serve`` last announced it."""
    text = (room.state_dir / "triton.log").read_text(errors="replace")
    return Path(text.rsplit("front door: nginx (pid ", 1)[1].split("its log ", 1)[1].split(";", 1)[0])


def _shared_triton(room: Any) -> int | None:
    """The tritonserver under the class's ``serve`` (behind the front door, on ports of its own)."""
    serve = json.loads((room.state_dir / "pids.json").read_text())["triton"]
    try:
        found = [p.pid for p in psutil.Process(serve).children(recursive=True) if p.name() == "tritonserver"]
    except psutil.NoSuchProcess:
        return None
    return found[0] if found else None


def _answers(url: str) -> bool:
    try:
        return rest.request(url, timeout=2)[0] == 200
    except OSError:
        return False


def _learner_servers(room: Any) -> dict[str, int]:
    """Each learner's single-user server process (not the dumb-init above it)."""
    return {p.info["username"]: p.pid for p in psutil.process_iter(["username", "cmdline"])
            if p.info["username"] in room.learners and p.name() != "dumb-init"
            and any("jupyterhub-singleuser" in a for a in p.info["cmdline"] or [])}


def test_a_learners_5000_connections_stay_within_their_limits_while_another_learner_works(classroom: Any) -> None:
    """#46: A's 5,000 idle connections through their forwarder: at most A's cap reach the door, the rest are refused
    at once, A's forwarders are in A's cgroups; B's request and A's JupyterLab answer meanwhile (connection_checks)."""
    learner_connections(classroom)


def test_a_curious_learners_attacks_on_the_door_are_refused_while_another_works(classroom: Any) -> None:
    """#46: as A, the crashers, a 256 MiB stream message, B's sequence IDs (inject, START, END; HTTP, gRPC, a
    stream) and tokenless requests are each refused or bounded; C's requests meanwhile are >= 99% answered,
    tritonserver and its stubs are the same processes, every model is ready and B's running mean is B's (~15 s)."""
    adversary(classroom, _learner_servers(classroom), _shared_triton)


#: Per restart: serve's backoff (1, 2, 4, 8, 16 s for five kills within a minute) plus a start with two models.
RESTART_DEADLINE_S = 60


def test_killing_the_shared_triton_five_times_then_the_hub_never_ends_the_class(classroom: Any) -> None:
    """#37: a learner who kills (or crashes) the shared Triton or the hub cannot end the class for the others.

    Five SIGKILLs in a row to the shared tritonserver: each time it is ready again on the same port with
    its models, and the hub and every learner's server are the same processes throughout. Then the hub
    itself: the supervisor starts it again, and it routes to the learners' servers that kept running.
    """
    room = classroom
    servers, hub = _learner_servers(room), json.loads((room.state_dir / "pids.json").read_text())["hub"]
    assert len(servers) == len(room.learners), servers
    models = room.settings()["models"]
    for kill in range(1, 6):
        pid = _shared_triton(room)
        assert pid, "the shared tritonserver was not found"
        os.kill(pid, signal.SIGKILL)
        port = int(room.triton_http.rpartition(":")[2])
        assert not port_is_free(port), f"kill {kill} freed the class's port {port}: the front door must hold it"
        back = poll(lambda: _shared_triton(room) not in (None, pid) and all(
            _answers(f"http://{room.triton_http}/v2/models/{m}/ready") for m in models), bool, RESTART_DEADLINE_S, 0.2)
        assert back, f"kill {kill}: the shared Triton is not back with its models on {room.triton_http}"
        assert room.proc.poll() is None and psutil.pid_exists(hub), f"kill {kill} ended the class"
        assert _learner_servers(room) == servers, f"kill {kill} ended a learner's server"
    room.remember()
    os.kill(hub, signal.SIGKILL)
    new_hub = poll(lambda: json.loads((room.state_dir / "pids.json").read_text())["hub"] != hub
                   and _answers(f"{room.hub_url}/hub/api/"), bool, RESTART_DEADLINE_S, 0.2)
    assert new_hub, f"the hub did not come back:\n{room.log.read_text()[-2000:]}"
    assert _learner_servers(room) == servers, "a learner's server did not survive the hub's death"
    for name in room.learners:  # Jupyter Server's /api answers without a login: the new proxy routes to it
        assert poll(lambda: _answers(f"{room.hub_url}/user/{name}/api"), bool, 30, 0.5), f"no route to {name}"
    assert "started again" in room.log.read_text()


def _listener(port: int) -> psutil.Process | None:
    """The process listening on ``port`` on this machine's loopback, if any."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return psutil.Process(conn.pid)
            except psutil.NoSuchProcess:
                return None
    return None


def test_stopping_the_class_leaves_nothing(classroom: Any) -> None:
    """The README's ``sudo make class-stop`` (the test's ``CLASS_STOP_ARGS`` after it) ends ``sudo make class`` with
    exit 0 and leaves no process, port, shared-memory region, namespace or cgroup of the class."""
    room = classroom
    room.remember()
    regions = shm_regions(sorted(room.seen))
    assert regions, "no Python-backend region seen: the shared Triton's stubs were not found"
    settings = room.settings()
    ports = [settings["hub_port"], settings["hub_api_port"], settings["proxy_api_port"], *settings["triton_ports"]]
    assert not any(port_is_free(p) for p in ports[:1] + ports[3:]), "the control: the class listens on its ports"
    stopped_at = time.time()
    done = room.stop()
    assert done.returncode == 0, done.stderr
    line, status = room.ran[-1]
    assert line.startswith(room.readme[3] + " ") and status == 0, room.ran
    started, status = room.ran[2]
    assert status == 0, f"`{started}` exited {status} after class-stop:\n{room.log.read_text()[-2000:]}"
    alive = [p for p in room.seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running after class stop: {[psutil.Process(p).cmdline()[:3] for p in alive]}"
    assert room.proc.poll() is not None
    # A port another process took since (free_ports hands them out) is not the class's: only one started before.
    held = {p: _listener(p) for p in ports if not port_is_free(p)}
    left = {p: proc.cmdline()[:3] for p, proc in held.items() if proc is not None and proc.create_time() < stopped_at}
    assert not left, f"ports still held by processes of before the stop: {left}"
    left = [r for r in regions if (SHM_DIR / r).exists()]
    assert not left, f"/dev/shm regions left: {left}"
    # The learners' own accounts: not every non-root uid the class ran (its nginx workers are nobody, as are
    # other doors' on this machine, a test beside this one).
    learner_uids = {pwd.getpwnam(name).pw_uid for name in room.learners}
    owned = [p.name for p in SHM_DIR.iterdir() if p.stat().st_uid in learner_uids]
    assert not owned, f"/dev/shm files of learners left: {owned}"
    procs = [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in learner_uids]
    assert not procs, f"learners' processes left: {procs}"
    for name in room.learners:  # their sandboxes: network namespaces, forwarders' sockets, cgroups
        assert not (NETNS_DIR / namespace_name(name)).exists(), f"{name}'s network namespace was left"
        assert not (SOCKET_ROOT / namespace_name(name)).exists(), f"{name}'s forwarders' sockets were left"
        assert not [g for g in cgroups.learner_groups(name) if g.exists()], f"{name}'s cgroups were left"
