"""Exercises at the end of the notebooks, checked against a real Triton server.

A notebook's last cells look like this::

    def request_body(x):            # the learner's answer
        raise NotImplementedError   # ... until they write it

    exercises.check("kserve_json_body", request_body, server)

:func:`check` runs the learner's answer against the server and either prints why it is right or
raises :class:`~lab_backends.errors.ExerciseError` with what the server did with it. An answer
that still raises ``NotImplementedError`` is reported as "not attempted yet" without failing the
notebook, so that a fresh notebook runs top to bottom (and under nbval in CI).

Reference solutions live in ``notebooks/solutions/<exercise>.py`` (each defines ``answer``), and
``tests/test_exercises.py`` runs every one through the same checks, so a solution and its checker
cannot drift apart. Adding an exercise: write a checker, decorate it with :func:`exercise`, add a
solution file.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lab_backends import rest
from lab_backends.errors import ExerciseError, LabBackendsError
from lab_backends.paths import PROJECT_ROOT

SOLUTIONS_DIR = PROJECT_ROOT / "notebooks" / "solutions"


@dataclass(frozen=True)
class Exercise:
    """One exercise: its task, the models its checker needs, and the checker itself."""

    name: str
    notebook: str
    task: str
    models: tuple[str, ...]
    checker: Callable[[Any, Any], str]


@dataclass(frozen=True)
class Result:
    """What :func:`check` found: ``passed`` or not ``attempted``, and a message for the learner."""

    name: str
    attempted: bool
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed


EXERCISES: dict[str, Exercise] = {}


def exercise(name: str, notebook: str, task: str, models: tuple[str, ...]) -> Callable:
    """Register ``checker(answer, server) -> success message`` as exercise ``name``.

    ``models`` are what :func:`check` loads when it has to start a server itself; with none, the
    checker gets ``server=None`` when the learner passes none (it may start its own).
    """

    def register(checker: Callable[[Any, Any], str]) -> Callable[[Any, Any], str]:
        if name in EXERCISES:
            raise LabBackendsError(f"exercise {name!r} is registered twice")
        EXERCISES[name] = Exercise(name, notebook, task, tuple(models), checker)
        return checker

    return register


def get(name: str) -> Exercise:
    if name not in EXERCISES:
        raise ExerciseError(f"no exercise named {name!r}; known: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[name]


def task(name: str) -> str:
    """The task text, for the notebook to print above the answer cell."""
    return get(name).task


def check(name: str, answer: Any, server: Any = None, quiet: bool = False) -> Result:
    """Check ``answer`` for exercise ``name`` against ``server`` (started here with the models if None)."""
    ex = get(name)
    if server is None and ex.models:
        from lab_backends.server.triton_server import TritonServer

        with TritonServer(models=list(ex.models)) as own:
            return check(name, answer, own, quiet)
    try:
        message = ex.checker(answer, server)
    except NotImplementedError:
        result = Result(name, False, False, f"'{name}' is not attempted yet: replace the NotImplementedError "
                                            f"with your answer and run the cell again.\nTask: {ex.task}")
        if not quiet:
            print(result.message)
        return result
    result = Result(name, True, True, message)
    if not quiet:
        print(f"✓ {name}: {message}")
    return result


def solution_path(name: str) -> Path:
    return SOLUTIONS_DIR / f"{name}.py"


def load_solution(name: str) -> Any:
    """The ``answer`` defined by ``notebooks/solutions/<name>.py``."""
    path = solution_path(name)
    if not path.exists():
        raise ExerciseError(f"no solution file {path}; every exercise needs one (tests run it)")
    spec = importlib.util.spec_from_file_location(f"solution_{name}", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    if not hasattr(module, "answer"):
        raise ExerciseError(f"{path} must define `answer` (the function or value the checker takes)")
    return module.answer


# ---------------------------------------------------------------------------------------- 01: KServe v2 JSON
def _post_json(server: Any, model: str, body: bytes) -> tuple[int, bytes]:
    return rest.request(
        f"http://{server.http_url}/v2/models/{model}/infer", "POST", body,
        {"Content-Type": "application/json"}, timeout=30,
    )


@exercise(
    "kserve_json_body",
    notebook="01_rest_and_grpc",
    task=(
        "Write request_body(x) that returns the KServe v2 JSON request body (a dict) for cost_model: "
        "x is a float32 array of shape [batch, 16] for input INPUT0; ask for output OUTPUT0 as JSON "
        "(no binary extension). The checker POSTs json.dumps(request_body(x)) to "
        "/v2/models/cost_model/infer for batches of 1 and 3 and expects the tensor back."
    ),
    models=("cost_model",),
)
def _check_kserve_json_body(answer: Callable[[np.ndarray], dict], server: Any) -> str:
    rng = np.random.default_rng(7)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        body = answer(x)
        if not isinstance(body, dict):
            raise ExerciseError(f"request_body must return a dict (the JSON object), not {type(body).__name__}")
        if any("parameters" in i and "binary_data_size" in i.get("parameters", {}) for i in body.get("inputs", [])):
            raise ExerciseError("this exercise is about plain JSON: put the numbers in 'data', no binary_data_size")
        try:
            encoded = json.dumps(body).encode()
        except TypeError as exc:
            raise ExerciseError(f"the body is not JSON-serialisable ({exc}); use x.flatten().tolist()") from exc
        status, payload = _post_json(server, "cost_model", encoded)
        if status != 200:
            raise ExerciseError(
                f"Triton answered HTTP {status} for a batch of {batch}: {payload.decode(errors='replace')}"
            )
        reply = json.loads(payload)
        outputs = {o["name"]: o for o in reply.get("outputs", [])}
        if "OUTPUT0" not in outputs:
            raise ExerciseError(f"the response has no OUTPUT0 (outputs: {list(outputs)}); did you ask for it?")
        out = outputs["OUTPUT0"]
        if "data" not in out:
            raise ExerciseError("OUTPUT0 came back binary; ask for it without 'binary_data' so it is JSON")
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        if got.shape != x.shape or not np.allclose(got, x):
            raise ExerciseError(
                f"cost_model echoed a tensor of shape {got.shape} that differs from x {x.shape}: check "
                "'shape' (it includes the batch dimension) and that 'data' is x flattened row by row"
            )
    return "Triton accepted your hand-written JSON for batches of 1 and 3 and echoed the exact tensor."


# ---------------------------------------------------------------------------------------- 02: read a trace
@exercise(
    "longest_queue",
    notebook="02_tracing_the_request_path",
    task=(
        "Write longest_queue(log) that takes a lab_backends.measure.trace.TraceLog and returns the request_id "
        "of the top-level request that spent the longest time in the scheduler queue. The checker "
        "sends a burst of requests to cost_model on a traced server and compares your answer with "
        "the trace's QUEUE_START/COMPUTE_START stamps."
    ),
    models=(),
)
def _check_longest_queue(answer: Callable[[Any], str], server: Any) -> str:
    import contextlib
    import tempfile
    import uuid

    from lab_backends.measure import trace
    from lab_backends.client.infer import make_inputs
    from lab_backends.server.triton_server import TritonServer

    with contextlib.ExitStack() as stack:
        if server is None or server.trace_file is None or server.target != "local":
            # A server of our own, traced: the checker must read the trace file it writes.
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="exercise-trace-"))
            server = stack.enter_context(TritonServer(
                models=["cost_model"], target="local", trace_file=Path(tmp) / "trace.json", trace_log_frequency=1))
        tag = uuid.uuid4().hex[:6]
        x = np.ones((1, 16), np.float32)
        server.grpc_client.infer("cost_model", make_inputs({"INPUT0": x}), request_id=f"warmup-{tag}")
        ids = trace.send_burst(server, "cost_model", {"INPUT0": x}, 6, prefix=f"burst-{tag}")
        # Without log_frequency the file appears only at shutdown: stop first, then read.
        if server.options.trace_log_frequency == 0:
            server.stop()
        log = trace.load(server.trace_file, request_ids=ids).select(ids)
    top = log.requests[log.requests["depth"] == 0]
    expected = top.loc[top["queue_ms"].idxmax()]
    got = answer(log)
    if got != expected["request_id"]:
        mine = top.loc[top["request_id"] == got, "queue_ms"]
        detail = f" ({float(mine.iloc[0]):.2f} ms)" if not mine.empty else " (not one of the burst's request ids)"
        raise ExerciseError(
            f"you returned {got!r}{detail}, but {expected['request_id']!r} queued longest "
            f"({expected['queue_ms']:.2f} ms). Queue time is COMPUTE_START - QUEUE_START of top-level requests."
        )
    return f"{got!r} waited {expected['queue_ms']:.1f} ms in the queue, the longest of the burst."


# ---------------------------------------------------------------------------------------- 04: a preprocessing backend
PREPROCESS_MODEL = "learner_preprocess"


@exercise(
    "preprocess_backend",
    notebook="04_custom_python_backend",
    task=(
        "Write the source of a model.py (a string) for a Python-backend preprocessing model: input IMAGE, "
        "UINT8 [8, 8] (a raw digit, values 0..16) -> output PIXELS, FP32 [64] = IMAGE / 8 - 1, flattened. "
        "The checker writes it into a fresh repository with a config of its own (max_batch_size 64, dynamic "
        "batching), loads it into a real server through the model-control API and sends real digits: "
        "batches of 1 and 5 images, and 4 requests at once (one execute() gets several requests)."
    ),
    models=(),
)
def _check_preprocess_backend(answer: str | None, server: Any) -> str:
    """Serve the learner's source on a server of our own: a broken model must not hurt theirs."""
    import tempfile

    from lab_backends.lessons import authoring
    from .digits.data import load_split, normalize
    from lab_backends.errors import ModelConfigError
    from lab_backends.server.triton_server import TritonServer

    if answer is None or "NotImplementedError" in answer:
        raise NotImplementedError
    if not isinstance(answer, str):
        raise ExerciseError(f"the answer is the source text of model.py (a str), not {type(answer).__name__}")
    config = authoring.python_config(
        PREPROCESS_MODEL,
        [authoring.Tensor("IMAGE", "UINT8", [8, 8])],
        [authoring.Tensor("PIXELS", "FP32", [64])],
        max_batch_size=64, dynamic_batching=True, max_queue_delay_us=100_000,
    )
    images = load_split().test_images
    with tempfile.TemporaryDirectory(prefix="exercise-preprocess-") as tmp:
        try:
            authoring.write_model(tmp, answer, config)
        except ModelConfigError as exc:
            raise ExerciseError(str(exc)) from exc
        with TritonServer(model_repository=[tmp], models=[], target="local") as own:
            try:
                own.load_model(PREPROCESS_MODEL)
            except Exception as exc:  # noqa: BLE001 - the server's refusal is the feedback
                raise ExerciseError(f"the server could not load your model.py: {exc}") from exc
            batches = [images[:1], images[1:6]]
            together = [images[6:7], images[7:9], images[9:12], images[12:13]]
            replies = [authoring.send_together(own, PREPROCESS_MODEL, [{"IMAGE": b}])[0] for b in batches]
            replies += authoring.send_together(own, PREPROCESS_MODEL, [{"IMAGE": b} for b in together])
            for batch, reply in zip(batches + together, replies):
                label = f"a request of {len(batch)} image(s)"
                if isinstance(reply, Exception):
                    raise ExerciseError(f"{label} failed: {reply}")
                if "PIXELS" not in reply:
                    raise ExerciseError(f"{label} came back without PIXELS (outputs: {sorted(reply)})")
                got, want = reply["PIXELS"], normalize(batch)
                if got.shape != want.shape:
                    raise ExerciseError(
                        f"{label}: PIXELS has shape {list(got.shape)}, expected {list(want.shape)}: one row of 64 "
                        "values per image of the request (reshape(len(x), 64), not reshape(-1))"
                    )
                if not np.allclose(got, want, atol=1e-6):
                    worst = int(np.abs(got - want).argmax())
                    raise ExerciseError(
                        f"{label}: PIXELS differs from IMAGE / 8 - 1, e.g. element {worst} is "
                        f"{got.flat[worst]:.4f}, expected {want.flat[worst]:.4f} (did you convert to float32 first?)"
                    )
            executions = own.statistics(PREPROCESS_MODEL)["model_stats"][0]["execution_count"]
    return (
        f"your model.py normalized {sum(len(b) for b in batches + together)} real digits in "
        f"{len(batches + together)} requests exactly, in {executions} execute() calls."
    )


# ---------------------------------------------------------------------------------------- 07: serve a canary
CANARY_MODEL = "canary"


@exercise(
    "canary_versions",
    notebook="07_model_management",
    task=(
        "Write canary(server, name) for a model with versions 1, 2 and 3 on disk, whose config.pbtxt serves "
        "only the latest (3). With ONE load call and a config override, make the server serve versions 1 and "
        "3 side by side (not 2) with max_batch_size lowered to 4, everything else as it is now. Do not touch "
        "any file. The checker calls canary on a fresh server, then proves it through the API: the repository "
        "index, a request to each version, a batch of 5 refused and 4 accepted, and the served config."
    ),
    models=(),
)
def _check_canary_versions(answer: Callable[[Any, str], Any], server: Any) -> str:
    import tempfile

    from lab_backends.lessons import authoring, management
    from lab_backends.client.infer import infer
    from lab_backends.server.triton_server import TritonServer

    with tempfile.TemporaryDirectory(prefix="exercise-canary-") as tmp:
        model_dir = authoring.write_model(
            tmp, management.VERSIONED_SOURCE, management.versioned_config(CANARY_MODEL), versions=(1, 2, 3)
        )

        def files() -> dict[Path, bytes]:  # __pycache__ is the stub's own doing, not the learner's
            return {p.relative_to(model_dir): p.read_bytes() for p in sorted(model_dir.rglob("*"))
                    if p.is_file() and "__pycache__" not in p.parts}

        before = files()
        with TritonServer(model_repository=[tmp], models=[CANARY_MODEL], target="local") as own:
            original = own.model_config(CANARY_MODEL)
            try:
                answer(own, CANARY_MODEL)
            except (NotImplementedError, ExerciseError):
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. the server refused the load: say so
                raise ExerciseError(f"canary(server, name) raised {type(exc).__name__}: {exc}") from exc
            if files() != before:
                raise ExerciseError("files in the model folder changed: do it with a config override on load, not on disk")
            states = management.version_states(own, CANARY_MODEL)
            if management.ready_versions(own, CANARY_MODEL) != [1, 3]:
                raise ExerciseError(
                    f"the repository index says {states}; expected versions 1 and 3 READY and 2 not. "
                    "A version_policy with specific versions does that"
                )
            config = own.model_config(CANARY_MODEL)
            lost = [f for f in ("input", "output", "parameters", "instance_group")
                    if list(getattr(config, f)) != list(getattr(original, f))]
            if lost:
                raise ExerciseError(
                    f"your override changed {', '.join(lost)}: Triton replaces the whole config with the one sent "
                    "on load, so start from server.model_config(name) and change only what the task asks"
                )
            if config.max_batch_size != 4:
                raise ExerciseError(f"the served config has max_batch_size {config.max_batch_size}, expected 4")
            served = {v: management.infer_version(own, CANARY_MODEL, v) for v in (1, 3)}
            if served != {1: 1, 3: 3}:
                raise ExerciseError(f"asking each version answered {served}")
            x4, x5 = np.zeros((4, 1), np.float32), np.zeros((5, 1), np.float32)
            infer(own, CANARY_MODEL, {"X": x4}, model_version="3")
            try:
                infer(own, CANARY_MODEL, {"X": x5}, model_version="3")
            except Exception as exc:  # noqa: BLE001 - the refusal is what we want
                refusal = str(exc)
            else:
                raise ExerciseError("a batch of 5 was accepted: max_batch_size 4 is not in force")
    return (
        f"versions {sorted(served)} answer side by side, 2 is not served ({states.get(2, 'not loaded')}), "
        f"and the server refuses a batch of 5: {refusal.splitlines()[0][:90]}"
    )


# ---------------------------------------------------------------------------------------- 08: interleaved sequences
def _model_ready(server: Any, model: str) -> bool:
    try:
        return bool(server.http_client.is_model_ready(model))
    except Exception:  # noqa: BLE001 - an unreachable or stopped server is simply not ready
        return False


@exercise(
    "interleaved_sequences",
    notebook="08_streaming_and_state",
    task=(
        "Write drive(server, sequences) for the stateful model running_mean. sequences maps a correlation ID "
        "(int) to a list of float values; the lists have different lengths. Advance the sequences in turn: in "
        "each round send the next value of every sequence that still has one (one request per value, VALUE "
        "of shape [1, 1], FP32), with sequence_start on a sequence's first request and sequence_end on its "
        "last. Return {correlation ID: the final MEAN the server answered}. Use lab_backends.client.infer.infer "
        "(its extra keyword arguments go to tritonclient: sequence_id=, sequence_start=, sequence_end=). "
        "The checker compares your means with its own, counts your requests in the statistics API, and "
        "checks that every sequence was ended."
    ),
    models=("running_mean",),
)
def _check_interleaved_sequences(answer: Callable[[Any, dict], dict], server: Any) -> str:
    """Random IDs and values each time, so a hard-coded answer cannot pass."""
    import contextlib

    from lab_backends.client import sequences
    from lab_backends.measure import stats as _stats
    from lab_backends.server.triton_server import TritonServer

    rng = np.random.default_rng()
    corrids = [int(c) for c in rng.choice(np.arange(10_000, 1_000_000), size=3, replace=False)]
    task = {c: [float(v) for v in rng.integers(-50, 50, size=n)] for c, n in zip(corrids, (4, 6, 3))}
    with contextlib.ExitStack() as stack:
        if server is None or not _model_ready(server, sequences.MODEL):
            server = stack.enter_context(TritonServer(models=[sequences.MODEL], target="local"))
        before = sequences.settled_statistics(server, sequences.MODEL)
        try:
            got = answer(server, {c: list(v) for c, v in task.items()})
        except (NotImplementedError, ExerciseError):
            raise
        except Exception as exc:  # noqa: BLE001 - the server's refusal is the feedback
            raise ExerciseError(f"drive(server, sequences) raised {type(exc).__name__}: {exc}") from exc
        after = sequences.settled_statistics(server, sequences.MODEL)
        if not isinstance(got, dict):
            raise ExerciseError(f"drive must return a dict {{correlation ID: final mean}}, not {type(got).__name__}")
        if set(got) != set(task):
            raise ExerciseError(f"you returned means for IDs {sorted(got)}, expected {sorted(task)}")
        for corrid, values in task.items():
            want = float(np.mean(values))
            if not np.isclose(float(got[corrid]), want, rtol=1e-5, atol=1e-5):
                raise ExerciseError(
                    f"sequence {corrid} (values {values}) ended with mean {float(got[corrid]):.4f}, expected "
                    f"{want:.4f}: was every value sent once, with START only on the first request of the sequence?"
                )
        sent, total = _stats.window(before, after, sequences.MODEL).requests, sum(len(v) for v in task.values())
        if sent != total:
            raise ExerciseError(f"running_mean received {sent} requests, expected {total}: one request per value")
        still_open = [c for c in task if sequences.is_live(server, c)]
        if still_open:
            raise ExerciseError(
                f"sequences {still_open} were still open after drive returned: send sequence_end=True with the "
                "last value, or the sequence holds a slot until max_sequence_idle_microseconds passes"
            )
    return (
        f"three interleaved sequences ({', '.join(str(len(v)) for v in task.values())} values) kept their own "
        f"means in {total} requests, and every one was ended."
    )


# ---------------------------------------------------------------------------------------- 05: frameworks agree
@exercise(
    "framework_agreement",
    notebook="05_wrapping_frameworks",
    task=(
        "Write logits_of(server, model, images) that returns the LOGITS (float32 [n, 10]) that the SERVED model "
        "(digits_torch or digits_onnx) computes for n raw digit images (uint8 [n, 8, 8], values 0..16). Normalize "
        "as the models expect (PIXELS = float32(IMAGE) / 8 - 1, shape [n, 64]); n is 150, more than the models' "
        "max_batch_size of 64, so split into requests of at most 64 rows and stitch the answers back in order. "
        "The checker calls it for both models, compares with the artifacts run in-process and with each other, "
        "and reads the statistics API to see that the server computed every row."
    ),
    models=("digits_torch", "digits_onnx"),
)
def _check_framework_agreement(answer: Callable[[Any, str, np.ndarray], np.ndarray], server: Any) -> str:
    from lab_backends.lessons.frameworks import check_agreement_answer

    return check_agreement_answer(answer, server)


# ---------------------------------------------------------------------------------------- 06: an ensemble in C
@exercise(
    "ensemble_with_c_preprocess",
    notebook="06_pipelines",
    task=(
        "Write my_ensemble(config) that takes a copy of digits_ensemble's config (a ModelConfig protobuf) and "
        "returns the config of a new ensemble named 'my_ensemble_c' that preprocesses with the C backend model "
        "digits_preprocess_c instead of digits_preprocess (same tensors, same other steps). Return a ModelConfig "
        "or config.pbtxt text. The checker serves it from a scratch repository on a server of its own, sends "
        "24 real digits, compares with digits_ensemble, and reads the statistics of both preprocessing models."
    ),
    models=(),
)
def _check_ensemble_with_c_preprocess(answer: Callable[[Any], Any], server: Any) -> str:
    from lab_backends.lessons.pipelines import check_ensemble_c_answer

    return check_ensemble_c_answer(answer, server)


# ---------------------------------------------------------------------------------------- 03: tune the batcher
BATCHER_CONCURRENCY = 32
BATCHER_P99_MS = 100.0
BATCHER_SPEEDUP = 4.0


@exercise(
    "tune_the_batcher",
    notebook="03_schedulers_and_dynamic_batching",
    task=(
        f"Write a config override for cost_model (a dict such as {{'dynamic_batching': {{...}}}}, or a function "
        f"that edits the ModelConfig it gets) that, with {BATCHER_CONCURRENCY} requests in flight and ONE model "
        f"instance, reaches at least {BATCHER_SPEEDUP:g}x the throughput of the same model without batching while "
        f"keeping p99 latency at or under {BATCHER_P99_MS:g} ms. The checker starts from cost_model's config with "
        "batching removed and one instance, applies your override, reloads the model on the real server, and "
        "measures both configs with the same closed-loop load. Beware: a long max_queue_delay batches more but "
        "makes every request wait."
    ),
    models=("cost_model",),
)
def _check_tune_the_batcher(answer: Any, server: Any) -> str:
    """Relative throughput (machine speed cancels out), absolute p99 (the learner's bound)."""
    import contextlib

    from lab_backends.measure.loadgen import run_closed
    from lab_backends.server.triton_server import TritonServer
    from lab_backends.measure.sweep import apply_config, derive_config

    if answer is None:
        raise NotImplementedError
    model = "cost_model"
    with contextlib.ExitStack() as stack:
        if server is None or server.options.trace_file is not None:
            # Tracing every request slows the batched side far more than the sleeping one.
            server = stack.enter_context(TritonServer(models=[model]))
        live = server.model_config(model)
        unbatched = derive_config(live, {"dynamic_batching": None,
                                         "instance_group": [{"kind": "KIND_CPU", "count": 1}]})
        try:
            tuned = derive_config(unbatched, answer)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad override: say what was wrong with it
            raise ExerciseError(f"your override could not be applied: {type(exc).__name__}: {exc}") from exc
        if not tuned.HasField("dynamic_batching"):
            raise ExerciseError("the tuned config has no dynamic_batching: without it every execute() runs one request")
        instances = sum(g.count or 1 for g in tuned.instance_group) or 1
        if instances != 1:
            raise ExerciseError(f"the tuned config runs {instances} instances; the task allows one: let the batcher do it")
        stack.callback(server.load_model, model, live)  # give the learner's server back as it was
        load = dict(requests=400, duration_s=2.5, warmup_requests=2 * BATCHER_CONCURRENCY)
        apply_config(server, model, unbatched)
        before = run_closed(server, model, BATCHER_CONCURRENCY, **load).summary
        apply_config(server, model, tuned)  # raises ModelLoadError with Triton's reason if refused
        after = run_closed(server, model, BATCHER_CONCURRENCY, **load)
    got, speedup = after.summary, after.summary["throughput_rps"] / before["throughput_rps"]
    avg_batch = after.server.avg_batch if after.server is not None else float("nan")
    measured = (f"{got['throughput_rps']:.0f} req/s ({speedup:.1f}x the unbatched {before['throughput_rps']:.0f}), "
                f"p99 {got['p99_ms']:.1f} ms, average batch {avg_batch:.1f}")
    if got["errors"]:
        raise ExerciseError(f"{got['errors']} requests failed with your config, first: {got['first_error'][:200]}")
    if speedup < BATCHER_SPEEDUP:
        raise ExerciseError(f"measured {measured}: the throughput must reach {BATCHER_SPEEDUP:g}x")
    if got["p99_ms"] > BATCHER_P99_MS:
        raise ExerciseError(f"measured {measured}: p99 is over {BATCHER_P99_MS:g} ms; shorten max_queue_delay or "
                            "add a preferred batch size that the load can fill")
    return f"{measured}: fast and within the p99 bound."
from lab_backends.lessons.inspector import exercise as _notebook11  # noqa: E402,F401 - registers "batch_of_eight"
