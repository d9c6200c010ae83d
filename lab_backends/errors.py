"""One exception hierarchy for the workbench.

Every message says what went wrong *and* what to do about it, because the reader is a learner
looking at a notebook cell, not a developer with a debugger.
"""

from __future__ import annotations


class LabBackendsError(Exception):
    """Base of every error raised by ``lab_backends``."""


class ServerBinaryNotFoundError(LabBackendsError):
    """The embedded ``tritonserver`` (or a piece it needs, such as the Python stub) is missing."""


class EnvironmentMismatchError(LabBackendsError):
    """The Python environment cannot run model code correctly (e.g. numpy 2 in this Triton)."""


class ServerStartupTimeoutError(LabBackendsError, TimeoutError):
    """The server did not become ready before its deadline; it has been stopped."""


class ServerExitedError(LabBackendsError):
    """The server process exited on its own; the message quotes its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(f"{message}\nlast log lines:\n{log_tail}" if log_tail else message)

    @classmethod
    def with_log(cls, message: str, log_tail: str) -> "ServerExitedError":
        return cls(message, log_tail)


class PortInUseError(LabBackendsError):
    """A port that was asked for explicitly is already taken."""


class ModelLoadError(LabBackendsError):
    """A model failed to load; ``model`` names it and ``reason`` quotes Triton."""

    def __init__(self, model: str, reason: str, hint: str = "") -> None:
        self.model = model
        self.reason = reason
        message = f"model '{model}' failed to load: {reason}"
        if hint:
            message += f"\n  how to fix: {hint}"
        super().__init__(message)


class ModelConfigError(LabBackendsError):
    """A ``config.pbtxt`` does not parse with Triton's model-config schema."""


class DockerUnavailableError(LabBackendsError):
    """The ``docker`` target was asked for, but no Docker engine (or SDK) is reachable."""


class RemoteServerError(LabBackendsError):
    """The server at ``TRITON_URL`` is not reachable or not ready."""


class BackendBuildError(LabBackendsError):
    """A C backend failed to compile or link."""


class StubCrashedError(LabBackendsError):
    """A Python backend stub died; Triton will not restart it by itself."""


class LoadSettingError(LabBackendsError):
    """A load, sweep, bench or panel setting is out of range (concurrency 0, a bad batch size...)."""


class LoadDeadlineError(LabBackendsError, TimeoutError):
    """A load (e.g. the batching panel's Run) did not end within its deadline; the message says what to check."""


class StatisticsError(LabBackendsError):
    """A statistics or metrics payload does not hold what was asked for (e.g. the model is missing)."""


class TraceError(LabBackendsError):
    """A trace file is missing, incomplete or does not hold the request asked for."""


class ExerciseError(LabBackendsError):
    """An exercise answer is wrong; the message says what the real server did with it."""


class ProtocolError(LabBackendsError):
    """The server refused a hand-built KServe v2 request; the message quotes its answer."""


class StreamingError(LabBackendsError):
    """A decoupled model's stream did not end within its time limit, or could not be opened."""


class SequenceError(LabBackendsError):
    """A stateful sequence was driven wrongly (no values, an unknown correlation ID, a bad step)."""


class MeasuredClaimError(LabBackendsError, AssertionError):
    """A timing claim did not hold twice in a row (the second time over a longer window).

    An AssertionError too, so that nbval and ``pytest`` report it like any failed check.
    """


class DeployError(LabBackendsError):
    """A deploy/ folder could not be rendered (kustomization or manifest problem)."""


class ServerCrashed(ServerExitedError):
    """A server that was serving exited without being asked to (a signal, an abort).

    Raised on the next call after the crash, quoting the log's last lines; ``server.restart()``
    brings it back with the same models and ports.
    """

    def __init__(self, message: str, log_tail: str = "", returncode: int | None = None) -> None:
        self.returncode = returncode
        super().__init__(message, log_tail)


class RequestTooLargeError(LabBackendsError, ValueError):
    """A request was refused before sending: its shape overflows or its size exceeds the stated bound."""


class FrontDoorError(LabBackendsError):
    """The front door (nginx before tritonserver) could not start: missing, refused its config or its ports."""
