"""What ``lab-backends serve`` and its crash report say (no server: the real runs are in
tests/test_with_key.py, tests/reliability/test_serve_admin.py and test_long_name_crash.py)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from lab_backends.cli import build_parser
from lab_backends.errors import ServerCrashed
from lab_backends.server import admin, crash
from lab_backends.server.target import Target

#: A libstdc++ abort as Triton 2.51 logs it (the long-file-name load; the path shortened here).
ABORT_LOG = """\
I1201 12:30:00.000000 1 model_lifecycle.cc:472] "loading: rel_double:1"
terminate called after throwing an instance of 'std::filesystem::__cxx11::filesystem_error'
  what():  filesystem error: status: File name too long [/tmp/folderX/""" + "A" * 256 + """]
Signal (6) received.
 0# 0x000055D8C2C6F0A9 in /venv/pytriton/tritonserver/bin/tritonserver
 1# 0x00007F0B9D05B050 in /lib/x86_64-linux-gnu/libc.so.6
"""


class _FakeTarget(Target):
    def __init__(self, code: int | None) -> None:
        super().__init__()
        self.code = code

    def exit_code(self) -> int | None:
        if isinstance(self.code, BaseException):
            raise self.code
        return self.code


class _FakeServer:
    """What crash.py asks of a server: its exit code (from its target), pid, log."""

    def __init__(self, code: int | None, log: str = "") -> None:
        self.target = _FakeTarget(code)
        self.pid, self.log_path, self._log = 4242, Path("/tmp/run/tritonserver.log"), log

    def exit_code(self) -> int | None:
        return self.target.exit_code()

    def log_text(self) -> str:
        return self._log


def test_the_crash_report_quotes_the_logs_own_what_line():
    message = str(crash.crash_error(_FakeServer(-6, ABORT_LOG), -6))
    assert "killed by signal 6 (SIGABRT)" in message
    assert "std::filesystem::__cxx11::filesystem_error" in message and "File name too long" in message
    assert "AAA…(256×'A')" in message  # the name's length, not 256 letters
    assert "bad_alloc" not in message and "JSON" not in message  # no guess from the signal
    assert "server.restart()" in message  # seen from Python


def test_the_crash_report_quotes_the_signal_line_or_says_the_log_names_no_cause():
    segv = "I1201 started\nSignal (15) received.\nI1201 started again\nSignal (11) received.\n 0# 0x0 in x\n"
    assert crash.log_cause(segv, -11) == "Signal (11) received."
    assert crash.log_cause("I1201 started\nSignal (15) received.\n", -11) == ""  # another signal's line
    silent = str(crash.crash_error(_FakeServer(-11, "I1201 started\n"), -11))
    assert "The log names no cause" in silent and "segmentation fault" in silent and "nested" not in silent


class _DyingServer(_FakeServer):
    """A server whose log already says "Signal (11) received." and that exits on the ``exits_after``-th look."""

    def __init__(self, log: str, exits_after: int) -> None:
        super().__init__(None, log)
        self.looks, self.exits_after = 0, exits_after

    def exit_code(self) -> int | None:
        self.looks += 1
        return -11 if self.looks >= self.exits_after else None


def test_a_server_that_is_still_dying_is_waited_for_and_named_a_crash():
    """The wait in raise_if_dying (taken when a client sees the connection closed before the signal handler has
    finished its stack trace), forced: the process exits on the fourth look."""
    dying = _DyingServer("I1201 started\nSignal (11) received.\n 0# 0x0 in tritonserver\n", exits_after=4)
    with pytest.raises(ServerCrashed, match=r"killed by signal 11 \(SIGSEGV\)"):
        crash.raise_if_dying(dying, within_s=10)
    assert dying.looks >= 4  # it looked until the exit


def test_a_server_whose_log_ends_otherwise_is_not_waited_for():
    restarted = _DyingServer("Signal (11) received.\n 0# 0x0 in x\nI1201 started again\n", exits_after=99)
    crash.raise_if_dying(restarted, within_s=10)  # an old crash's line, then a new server's: nothing to wait for
    assert restarted.looks == 1
    remote = _DyingServer("Signal (11) received.\n", exits_after=99)
    remote.pid = None
    crash.raise_if_dying(remote, within_s=10)  # a server we did not start is not ours to watch
    stubborn = _DyingServer("Signal (11) received.\n", exits_after=99)
    crash.raise_if_dying(stubborn, within_s=0.3)  # the wait is bounded: the caller's own error then stands
    assert 2 <= stubborn.looks < 99


def test_serve_advice_says_when_restart_restarts_and_no_python_api():
    message = str(crash.crash_error(_FakeServer(-6, ABORT_LOG), -6, advice=crash.SERVE_ADVICE))
    assert "restart()" not in message
    assert "lab-backends serve --restart" in message and "never gives up" in message
    assert "1 s after the first crash" in message
    assert "restart" not in str(crash.crash_error(_FakeServer(-6, ABORT_LOG), -6, advice="")).split("(log:")[0]


def test_crashed_asks_the_target():
    assert crash.crashed(_FakeServer(-6)) == -6
    assert crash.crashed(_FakeServer(None)) is None
    assert crash.crashed(_FakeTarget(1)) == 1  # a target itself works too
    assert crash.crashed(object()) is None  # nothing to ask: not crashed


def test_supervise_returns_0_on_ctrl_c():
    assert crash.supervise(_FakeServer(KeyboardInterrupt()), report=lambda m: None) == 0


def test_describe_exit_names_the_signal_without_guessing_the_request():
    assert crash.describe_exit(-int(signal.SIGABRT)).startswith("killed by signal 6 (SIGABRT): an abort")
    assert crash.describe_exit(3) == "exited with code 3"


def test_serve_banners_and_help():
    key_lines = "\n".join(admin.banner(Path("/tmp/admin.key"), False))
    assert "HTTP header 'admin-key'" in key_lines and "gRPC metadata 'triton-grpc-protocol-admin-key'" in key_lines
    assert "lab-backends with-key --key-file /tmp/admin.key -- python" in key_lines
    plain = "\n".join(admin.banner(None, False))
    assert "--open-admin-apis" in plain and "--admin-key-file" in plain and "with-key" in plain
    assert admin.banner(None, True) == []  # open: the warning on stderr says it
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    text = serve.format_help()
    assert "--model-control-mode=explicit" in text and "only the --model NAME ones" in text
    assert "load_model('NAME')" in text and "lab-backends with-key" in text
    assert "it never gives up" in text.replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize("argv", [["with-key", "--", "python", "x.py", "--key-file", "z"]])
def test_with_key_leaves_the_commands_arguments_alone(argv):
    from lab_backends.client.with_key import command_line

    args = build_parser().parse_args(argv)
    assert args.key_file is None and command_line(args.command)[1:] == ["x.py", "--key-file", "z"]
