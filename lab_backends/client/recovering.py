"""One inference that survives a crashed Python stub: recover the model once, say so, retry.

Built on :mod:`lab_backends.server.health` (which finds and recovers dead stubs); here because it
sends the inference, which is the client layer's job.
"""

from __future__ import annotations

from typing import Any, Mapping

from lab_backends.client.infer import infer
from lab_backends.errors import StubCrashedError
from lab_backends.server.health import Notify, crashed_instance, model_of_instance, recover, to_stderr
from lab_backends.server.running import RunningServer


def infer_with_recovery(
    server: RunningServer,
    model: str,
    inputs: Mapping[str, Any],
    notify: Notify | None = to_stderr,
    **kwargs: Any,
) -> dict:
    """:func:`lab_backends.client.infer.infer`, but a crashed stub is recovered once and the call retried.

    The crashed instance may belong to another model than ``model`` (a step of an ensemble or a
    BLS call): the model that owns it is the one reloaded. A second failure of the same kind raises
    :class:`StubCrashedError`; every other error propagates unchanged.
    """
    result, crash = _attempt(server, model, inputs, kwargs)
    if crash is None:
        return result
    instance = crash[0]
    owner = model_of_instance(server, instance)
    recover(server, owner, notify=notify, trigger=instance)
    result, again = _attempt(server, model, inputs, kwargs)
    if again is None:
        return result
    raise StubCrashedError(
        f"model '{owner}' was reloaded after its stub {instance} died, but the retried request "
        f"failed the same way ({again[0]}): its model.py kills its own process on this input. "
        "Look at server.log_text()."
    ) from again[1]


def _attempt(server: RunningServer, model: str, inputs: Mapping[str, Any],
             kwargs: dict[str, Any]) -> tuple[dict, tuple[str, Exception] | None]:
    """The answer, or the crashed stub's instance and the error; any other error propagates."""
    try:
        return infer(server, model, inputs, **kwargs), None
    except Exception as exc:
        instance = crashed_instance(exc)
        if instance is None:
            raise
        return {}, (instance, exc)
