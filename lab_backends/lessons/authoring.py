"""Write a Python-backend model folder from source text, and read back what it reports.

Notebook 04 writes a ``model.py`` in a cell and serves it at once. The folder it needs
(``<repo>/<name>/config.pbtxt`` plus ``<repo>/<name>/<version>/model.py``) is written here, with
the config built from Triton's own protobuf schema (``model_config_pb2``) so that a misspelt field
fails in Python, with its name, instead of as a load error in the server log.

The custom metrics a ``model.py`` declares with ``pb_utils.MetricFamily`` appear on the server's
Prometheus page next to Triton's own; :func:`metric_samples` reads them back.
"""

from __future__ import annotations

import ast
import py_compile
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tritonclient.grpc import model_config_pb2

from lab_backends.client.infer import make_inputs
from lab_backends.errors import ModelConfigError
from lab_backends.measure.stats import parse_metrics, scrape_metrics
from lab_backends.server.repository import ModelConfig, config_text, read_config
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll

#: Triton data types a learner's tensors may use here (the ``TYPE_`` prefix is added for you).
DTYPES = ("BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES")


@dataclass(frozen=True)
class Tensor:
    """One input or output: ``Tensor("IMAGE", "UINT8", [8, 8])``. Dims exclude the batch dimension."""

    name: str
    dtype: str
    dims: Sequence[int]


def data_type(dtype: str) -> int:
    """``"FP32"`` -> ``model_config_pb2.TYPE_FP32``, with a clear error for anything else."""
    key = dtype.upper().removeprefix("TYPE_")
    if key not in DTYPES:
        raise ModelConfigError(f"unknown data type {dtype!r}; use one of {', '.join(DTYPES)}")
    # The config schema spells BYTES as TYPE_STRING (the wire protocol says BYTES).
    return model_config_pb2.DataType.Value("TYPE_STRING" if key == "BYTES" else f"TYPE_{key}")


def python_config(
    name: str,
    inputs: Sequence[Tensor] = (),
    outputs: Sequence[Tensor] = (),
    *,
    max_batch_size: int = 0,
    dynamic_batching: bool = False,
    max_queue_delay_us: int = 0,
    instances: int = 1,
    parameters: Mapping[str, Any] | None = None,
) -> ModelConfig:
    """A ``ModelConfig`` for a Python-backend model, built field by field.

    Leave ``inputs``/``outputs`` empty to let the model's ``auto_complete_config`` fill them in.
    ``parameters`` become string parameters (``args["model_config"]["parameters"]`` in ``model.py``).
    """
    if max_batch_size < 0:
        raise ModelConfigError(f"max_batch_size must be >= 0 (0 = no batching), not {max_batch_size}")
    if max_queue_delay_us and not dynamic_batching:
        raise ModelConfigError("max_queue_delay_us only means something with dynamic_batching=True")
    config = ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    for tensor in inputs:
        config.input.add(name=tensor.name, data_type=data_type(tensor.dtype), dims=list(tensor.dims))
    for tensor in outputs:
        config.output.add(name=tensor.name, data_type=data_type(tensor.dtype), dims=list(tensor.dims))
    if instances:
        config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=instances)
    if dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
        config.dynamic_batching.SetInParent()  # present even when every field is at its default
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = str(value)
    return config


def bare_config(name: str) -> ModelConfig:
    """Only a name and ``backend: "python"``: the rest is left to the model's ``auto_complete_config``.

    Triton asks the Python backend to complete a config before it validates it (unless the server
    runs with ``--disable-auto-complete-config``), so a model can declare its own tensors in code.
    """
    return ModelConfig(name=name, backend="python")


def check_source(source: str, filename: str = "model.py") -> None:
    """Refuse source that cannot be a Python-backend model, before the server gets to see it.

    A syntax error or a missing ``TritonPythonModel`` would otherwise surface as a load failure
    with the reason buried in the server log.
    """
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise ModelConfigError(f"{filename} does not parse: line {exc.lineno}: {exc.msg}") from exc
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    if "TritonPythonModel" not in classes:
        raise ModelConfigError(
            f"{filename} defines no class TritonPythonModel; the Python backend instantiates exactly that name"
        )
    methods = {n.name for n in classes["TritonPythonModel"].body if isinstance(n, ast.FunctionDef)}
    if "execute" not in methods:
        raise ModelConfigError(f"{filename}: TritonPythonModel has no execute(self, requests) method")


def write_model(
    repository: str | Path,
    source: str,
    config: ModelConfig,
    versions: Sequence[int] = (1,),
) -> Path:
    """Write ``<repository>/<config.name>/`` with ``config.pbtxt`` and ``<v>/model.py`` per version.

    Rewriting an existing folder replaces its files, which is how a reload picks up new code.
    Returns the model folder.

    Each ``model.py`` is byte-compiled here, so the stub finds its cache and writes nothing into the
    folder. Else a version's first load writes ``<v>/__pycache__``, which Triton takes for a change:
    a load compares the newest modification time in the model's folder with the last load's
    (core model_repository_manager.cc L396-L401, L1548-L1570 at r24.10), and a plain load after a
    config override that loaded a version for the first time read config.pbtxt again (measured).
    """
    if not config.name:
        raise ModelConfigError("the config needs a name: python_config(name=...) sets it")
    if not versions or any(int(v) < 1 for v in versions):
        raise ModelConfigError(f"versions must be positive integers, not {list(versions)}")
    check_source(source)
    model_dir = Path(repository) / config.name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config_text(config))
    for version in versions:
        version_dir = model_dir / str(int(version))
        version_dir.mkdir(exist_ok=True)
        (version_dir / "model.py").write_text(source)
        py_compile.compile(str(version_dir / "model.py"), doraise=True)
    return model_dir


def written_config(model_dir: str | Path) -> ModelConfig:
    """The config on disk (what the server reads at load time unless a load overrides it)."""
    return read_config(Path(model_dir))


def metric_samples(server: RunningServer, family: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of one metric family on the server's metrics page: ``[(labels, value), ...]``.

    Custom metrics from ``model.py`` appear under the name their ``MetricFamily`` was given.
    Measured on Triton 2.51: a family that ``model.py`` does not keep alive (a local variable in
    ``initialize``) takes its series with it, and increments then go nowhere, silently; a series
    that was kept outlives an unload, and a reload of the same model continues counting from it.
    """
    parsed = parse_metrics(scrape_metrics(server))
    return [(dict(labels), value) for (name, labels), value in parsed.samples.items() if name == family]


def metric_value(server: RunningServer, family: str, **labels: str) -> float | None:
    """The value of the one sample of ``family`` whose labels include ``labels``; None if absent."""
    for sample_labels, value in metric_samples(server, family):
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            return value
    return None


def send_together(
    server: RunningServer, model: str, requests: Sequence[Mapping[str, Any]], timeout_s: float = 30.0
) -> list[dict[str, Any] | Exception]:
    """Send several requests at once (gRPC, asynchronously) and return each one's outputs or error.

    Sent back to back, they arrive within a millisecond or so: a dynamic batcher with a queue
    delay hands them to one ``execute`` call, which is what a batch-aware ``model.py`` must handle.
    A failed request's slot holds the exception the client raised, so a notebook can show which
    requests of a batch failed and why.
    """
    results: "queue.Queue[tuple[int, Any, Any]]" = queue.Queue()
    grpc = server.grpc_client
    for index, inputs in enumerate(requests):
        grpc.async_infer(
            model,
            make_inputs(inputs, "grpc"),
            callback=lambda result, error, i=index: results.put((i, result, error)),
            client_timeout=timeout_s,  # each call ends by the deadline too, not only our wait for it
        )
    collected: dict[int, dict[str, Any] | Exception] = {}
    unanswered = 0  # calls our own client_timeout ended: no answer, as when our wait below runs out
    deadline = time.monotonic() + timeout_s
    while len(collected) + unanswered < len(requests):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            index, result, error = results.get(timeout=remaining)
        except queue.Empty:
            continue
        if error is not None and "DEADLINE_EXCEEDED" in str(error.status() if hasattr(error, "status") else error):
            unanswered += 1
        elif error is not None:
            collected[index] = error
        else:
            names = [o["name"] for o in result.get_response(as_json=True)["outputs"]]
            collected[index] = {name: result.as_numpy(name) for name in names}
    if len(collected) < len(requests):
        raise TimeoutError(
            f"{len(requests) - len(collected)} of {len(requests)} requests to '{model}' got no answer "
            f"within {timeout_s:.0f} s; is execute() stuck, or does it return fewer responses than requests?"
        )
    return [collected[i] for i in range(len(requests))]


def log_lines(server: RunningServer, needle: str) -> list[str]:
    """Lines of the server log that contain ``needle`` (e.g. what ``pb_utils.Logger`` wrote)."""
    return [line for line in server.log_text().splitlines() if needle in line]


def wait_for_log(server: RunningServer, needle: str, count: int = 1, timeout_s: float = 10.0) -> list[str]:
    """Wait until the server log holds ``count`` lines with ``needle``; return them.

    ``pb_utils.Logger`` messages travel from the stub process to the server, which writes them a
    moment later: reading the log right after a call may be too early.
    """
    return poll(lambda: log_lines(server, needle), lambda found: len(found) >= count, timeout_s, 0.1)
