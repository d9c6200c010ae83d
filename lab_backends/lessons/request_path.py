"""Which scheduler and which backend serve a model, as the running server *shows* it (notebook 00).

:mod:`lab_backends.lessons.diagram` reads the path from a config; this module observes it, so that
a prediction (the exercise of notebook 00) can be checked against what the server does rather
than against the same rules restated:

* **sequence batcher**: one request without a correlation ID is refused with Triton's words
  ``must specify a non-zero or non-empty correlation ID`` (core
  ``src/sequence_batch_scheduler/sequence_utils.h`` L48-54 at r24.10); every other model answers it;
* **ensemble**: that one request executed each of its steps (their ``execution_count`` grew);
* **dynamic batcher or default**: the live config, the server's own normalized account, has a
  ``dynamic_batching`` section or not (core ``src/backend_model.cc`` L821-847 picks the scheduler
  from exactly that; the default scheduler is the dynamic batch scheduler with batching off);
* **python**: a stub process runs the model's instances (the stub's command line names the
  instance and, for a Python-based backend such as ``sklearn``, the backend folder whose
  ``model.py`` it runs);
* **C**: no stub, and the server process has mapped ``libtriton_<backend>.so``.

Processes can be seen only for a server started here (target ``local``); for another the backend
is read from the live config (``runtime: "model.py"`` marks a Python-based backend) and the
evidence says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.errors import LabBackendsError
from lab_backends.lessons import diagram
from lab_backends.measure.loadgen.payloads import example_inputs
from lab_backends.server import health
from lab_backends.server.processes import command_line, mapped_files
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll

#: Triton's refusal of a request without a correlation ID, by a sequence-batched model.
NO_CORRELATION_ID = "must specify a non-zero or non-empty correlation ID"
#: The backends this exercise tells apart: a stub process, a C library, or none (an ensemble).
BACKENDS = ("python", "C", None)


@dataclass(frozen=True)
class Observation:
    """What the server showed about one model's path: scheduler, backend, and the evidence in words."""

    model: str
    scheduler: str
    backend: str | None
    scheduler_evidence: str
    backend_evidence: str


def instance_names(config: Any) -> list[str]:
    """The instance names of a model's config: ``<group>_<k>``, an unnamed group being ``<model>_<index>``
    (core ``src/model_config_utils.cc`` L851 at r24.10)."""
    names = []
    for index, group in enumerate(config.instance_group):
        base = group.name or f"{config.name}_{index}"
        names += [f"{base}_{k}" for k in range(max(group.count, 1) * max(len(group.gpus), 1))]
    return names or [f"{config.name}_0_0"]


def _executions(server: RunningServer, model: str) -> int:
    return int(server.statistics(model)["model_stats"][0]["execution_count"])


def _one_request(server: RunningServer, config: Any) -> str:
    """Send one valid request without a correlation ID; Triton's refusal text, or "" when answered."""
    try:
        infer(server, config.name, example_inputs(config))
    except InferenceServerException as exc:
        return str(exc)
    return ""


def _scheduler(server: RunningServer, config: Any) -> tuple[str, str]:
    steps = [step.model_name for step in config.ensemble_scheduling.step]
    before = {step: _executions(server, step) for step in steps}
    refusal = _one_request(server, config)
    if NO_CORRELATION_ID in refusal:
        return "sequence batcher", f"a request without a correlation ID was refused: '{refusal}'"
    if refusal:
        raise LabBackendsError(f"{config.name} refused a plain request for another reason: {refusal}")
    if config.platform == "ensemble":
        def grown(counts: dict[str, int]) -> bool:
            return all(counts[s] > before[s] for s in steps)

        after = poll(lambda: {s: _executions(server, s) for s in steps}, grown, timeout_s=10)
        ran = ", ".join(f"{s} (+{after[s] - before[s]})" for s in steps)
        if not grown(after):
            raise LabBackendsError(f"one request to the ensemble {config.name} did not execute every step: {ran}")
        return "ensemble", f"one request executed each of its steps: {ran}"
    if config.HasField("dynamic_batching"):
        return "dynamic batcher", ("a request without a correlation ID was answered, and the live config has "
                                   "dynamic_batching { " + str(config.dynamic_batching).replace("\n", " ") + "}")
    return "default", "a request without a correlation ID was answered, and the live config has no dynamic_batching"


def _backend(server: RunningServer, config: Any) -> tuple[str | None, str]:
    if config.platform == "ensemble":
        return None, "no instance, no stub, no library of its own: its steps ran in other models"
    named = config.backend or config.platform
    if getattr(server, "target", "local") != "local":
        python = named == "python" or config.runtime == "model.py"
        return ("python" if python else "C"), (
            f"live config: backend '{named}', runtime '{config.runtime}' (processes are not visible on a "
            f"{getattr(server, 'target', 'remote')} server)")
    stubs = health.stubs(server)
    mine = [stubs[name] for name in instance_names(config) if name in stubs]
    if mine:
        stub = mine[0]
        from_backend = f"; the config names backend '{named}'" if named != "python" else ""
        return "python", (f"stub process pid {stub.pid} runs instance {stub.instance} ({stub.model_file})"
                          f"{_runtime(stub.pid, named)}{from_backend}")
    libraries = sorted(Path(p).name for p in mapped_files(server.pid) if Path(p).name == f"libtriton_{named}.so")
    if libraries:
        return "C", f"no stub process; the server process maps {libraries[0]}"
    raise LabBackendsError(f"{config.name}: neither a stub process nor libtriton_{named}.so in the server")


def _runtime(pid: int, named: str) -> str:
    """The stub's last argument: ``DEFAULT`` for a ``python`` model, the backend folder of a Python-based one."""
    args = command_line(pid)
    runtime = args[9] if len(args) > 9 else ""
    return f", with the runtime of backend folder {runtime}" if runtime and runtime != "DEFAULT" else ""


def observe(server: RunningServer, model: str) -> Observation:
    """The scheduler and backend of ``model`` as ``server`` shows them (sends one request to it)."""
    if not server.model_ready(model):
        raise LabBackendsError(f"{model} is not loaded on this server: load it first")
    config = server.model_config(model)
    scheduler, scheduler_evidence = _scheduler(server, config)
    backend, backend_evidence = _backend(server, config)
    return Observation(model, scheduler, backend, scheduler_evidence, backend_evidence)


def observe_all(server: RunningServer, models: Iterable[str]) -> list[Observation]:
    return [observe(server, model) for model in models]


def against_diagram(observations: Iterable[Observation], configs: dict[str, Any]) -> dict[str, str]:
    """Models whose place on :func:`diagram.architecture_diagram` differs from what the server showed.

    The diagram applies the config's rules; this holds them to the server's behaviour. Empty when
    they agree; else ``{model: "drawn (...), shown (...)"}``.
    """
    boxes = {"python": "python", "C": "C (custom)", None: diagram.NO_BACKEND}
    differ = {}
    for seen in observations:
        drawn = (diagram.scheduler_of(configs[seen.model]), diagram.backend_of(configs[seen.model]))
        shown = (seen.scheduler, boxes[seen.backend])
        if drawn != shown:
            differ[seen.model] = f"drawn {drawn}, shown {shown}"
    return differ


def table(observations: Iterable[Observation]) -> pd.DataFrame:
    """One row per model: scheduler and backend with their evidence."""
    rows = [{"model": o.model, "scheduler": o.scheduler, "backend": o.backend or "(none)",
             "scheduler evidence": o.scheduler_evidence, "backend evidence": o.backend_evidence}
            for o in observations]
    return pd.DataFrame(rows).set_index("model")
