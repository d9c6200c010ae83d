"""Notebook 09's exercise: a C backend ``clip`` written by the learner, checked on a real server.

The learner completes ``notebooks/exercises/clip.c`` (a skeleton with ``TODO(exercise)`` marks);
:func:`check_clip_answer` then does what a reviewer and a test server would:

1. reads the source: still marked TODO -> "not attempted"; a response deleted after it was sent
   (the double free the lab's own backends used to have) -> refused with the line;
2. builds it with ``gcc -Wall -Wextra -Werror`` and ``-Wl,-z,defs`` (:mod:`lab_backends.server.cbackend`),
   so warnings and misspelled API names fail the check at build time;
3. serves it on a server *of its own* (a segfaulting backend must not take the learner's server
   down) with bounds drawn at random (a hard-coded answer cannot pass), and checks: a model whose
   bounds are not numbers fails to load with a reason naming the parameter; batched requests are
   clamped exactly; in a burst, requests holding a NaN get their own error while their batch-mates
   are answered; a request whose dtype the backend does not take (the config says FP64, as
   ``c_scale_fp64`` does in the tests: Triton itself refuses a dtype that contradicts the config,
   so only a config that lets it through reaches the backend) gets the backend's error and the
   server keeps serving; and the statistics API shows executions of batches larger than 1.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from lab_backends.errors import BackendBuildError, ExerciseError, ModelLoadError
from lab_backends.lessons import c_source
from lab_backends.paths import PROJECT_ROOT

NAME = "clip_backend"
BACKEND = "clip"
SKELETON = PROJECT_ROOT / "notebooks" / "exercises" / "clip.c"
TODO_MARK = "TODO(exercise)"
#: What the checker says while clip.c is the untouched skeleton.
NOT_ATTEMPTED = (f"complete the four {TODO_MARK} places in {SKELETON.relative_to(PROJECT_ROOT)} (the marks may stay), "
                 "then run this cell again")
TASK = (
    "Complete notebooks/exercises/clip.c, a C backend 'clip': OUTPUT0 = INPUT0 clamped to [lo, hi] elementwise "
    "(FP32 [batch, n]), with lo and hi read from the model config's parameters in ModelInitialize (a missing "
    "or non-numeric bound, or lo > hi, fails the load with a message naming it). A request whose INPUT0 is not "
    "FP32 or holds a NaN gets its own error response; the rest of its batch is answered. Then call "
    "exercises.check('clip_backend', path_to_your_clip_c). The checker builds it with -Wall -Wextra -Werror "
    "-Wl,-z,defs, serves it on a server of its own and sends batched, concurrent and bad requests."
)
#: Executions with more than one request: the burst is repeated at most this often to see one.
BURST_TRIES = 4
BURST_SIZE = 12


def _config(name: str, lo: str, hi: str, dtype: str = "TYPE_FP32") -> Any:
    from lab_backends.server.repository import ModelConfig

    config = ModelConfig(name=name, backend=BACKEND, max_batch_size=16)
    config.input.add(name="INPUT0", data_type=model_config_pb2.DataType.Value(dtype), dims=[-1])
    config.output.add(name="OUTPUT0", data_type=model_config_pb2.DataType.Value(dtype), dims=[-1])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    config.dynamic_batching.max_queue_delay_microseconds = 20_000
    config.parameters["lo"].string_value = lo
    config.parameters["hi"].string_value = hi
    return config


def _write(repo: Path, config: Any) -> None:
    from lab_backends.server.repository import config_text

    (repo / config.name / "1").mkdir(parents=True, exist_ok=True)
    (repo / config.name / "config.pbtxt").write_text(config_text(config))


def read_answer(answer: Any) -> tuple[Path, str]:
    """The learner's C file and its text; ``NotImplementedError`` while it is still the skeleton.

    "Not attempted" means the file is the skeleton as handed out (whitespace aside), nothing else:
    a finished clip.c may well keep the skeleton's comments, ``TODO(exercise)`` marks included, and
    a half-finished one is an attempt whose faults the checks below name.
    """
    if answer is None:
        raise NotImplementedError(NOT_ATTEMPTED)
    path = Path(answer)
    if not path.is_file():
        raise ExerciseError(f"{path} is not a file: pass the path of your clip.c (the skeleton is {SKELETON})")
    source = path.read_text()
    if _words(source) == _words(SKELETON.read_text()):
        raise NotImplementedError(NOT_ATTEMPTED)
    return path, source


def _words(text: str) -> list[str]:
    return text.split()


def _batch_executions(stats: dict) -> dict[int, int]:
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


def check_clip_answer(answer: Any, server: Any = None) -> str:
    """Build, serve and exercise the learner's clip.c; ``server`` is unused (we start our own).

    In the order a learner fixes things: the ownership rule, the build, the config's bounds, one
    good request, a burst with bad batch-mates, a wrong dtype, and the server still serving.
    """
    from lab_backends.client.infer import infer
    from lab_backends.server.triton_server import TritonServer

    del server  # a backend that crashes must not take the learner's server with it
    path, source = read_answer(answer)
    problems = c_source.responses_deleted_after_send(source)
    if problems:
        raise ExerciseError(
            f"{path.name}: {problems[0]}. After ResponseSend the response is Triton's, even when the "
            "send returned an error: log and free the error, never ResponseDelete it"
        )
    rng = np.random.default_rng()
    lo, hi = round(float(rng.uniform(-3, -0.5)), 2), round(float(rng.uniform(0.5, 3)), 2)
    with tempfile.TemporaryDirectory(prefix="exercise-clip-") as tmp:
        repo, backends = Path(tmp) / "models", Path(tmp) / "backends"
        _build(path, backends)
        _write(repo, _config("clip_main", f"{lo:g}", f"{hi:g}"))
        _write(repo, _config("clip_fp64", f"{lo:g}", f"{hi:g}", dtype="TYPE_FP64"))
        _write(repo, _config("clip_bad_bound", "low", f"{hi:g}"))
        with TritonServer(repo, models=[], backend_dir=backends, target="local") as own:
            _check_loads(own, lo, hi)
            x = (rng.standard_normal((3, 7)) * 3).astype(np.float32)
            want = _check_one_request(own, x, lo, hi)
            answered, failed, sizes = _check_bursts(own, rng, lo, hi)
            _check_fp64_refused(own, x)
            if not own.is_ready() or not np.array_equal(infer(own, "clip_main", {"INPUT0": x})["OUTPUT0"], want):
                raise ExerciseError("after the bad requests the server no longer serves clip_main correctly")
    return (
        f"clip.c built with -Werror and -z defs; lo={lo}, hi={hi} read from the config; {answered} good "
        f"requests clamped exactly, {failed} NaN requests refused alone in their batches (batch sizes "
        f"{sizes}), FP64 refused, the server still serving."
    )


def _build(path: Path, backends: Path) -> None:
    from lab_backends.server import cbackend

    try:
        cbackend.build(path, BACKEND, backends, extra_flags=("-Werror",))
    except BackendBuildError as exc:
        raise ExerciseError(f"your clip.c does not build with -Wall -Wextra -Werror -Wl,-z,defs:\n{exc}") from exc


def _check_loads(own: Any, lo: float, hi: float) -> None:
    """A non-numeric bound must fail the load, naming it; good bounds must load."""
    try:
        own.load_model("clip_bad_bound")
    except ModelLoadError as exc:
        if "lo" not in str(exc):
            raise ExerciseError(
                f"a config with lo='low' failed to load, but the reason does not name 'lo': {exc}"
            ) from exc
    else:
        raise ExerciseError(
            "a config with lo='low' loaded: ModelInitialize must refuse a bound that is "
            "not a number (return an error naming the parameter)"
        )
    for model in ("clip_main", "clip_fp64"):
        try:
            own.load_model(model)
        except ModelLoadError as exc:
            raise ExerciseError(f"the server could not load your backend with lo={lo}, hi={hi}: {exc}") from exc


def _check_one_request(own: Any, x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    from tritonclient.utils import InferenceServerException

    from lab_backends.client.infer import infer

    want = np.clip(x, np.float32(lo), np.float32(hi))
    try:
        got = infer(own, "clip_main", {"INPUT0": x})["OUTPUT0"]
    except InferenceServerException as exc:
        raise ExerciseError(f"a good request of shape [3, 7] failed: {exc.message()}") from exc
    if got.shape != x.shape or not np.array_equal(got, want):
        raise ExerciseError(
            f"with lo={lo}, hi={hi} the input {x[0, :4]} came back as {got.ravel()[:4]} "
            f"(shape {list(got.shape)}), expected {want[0, :4]} (shape {list(x.shape)})"
        )
    return want


def _check_burst_reply(i: int, reply: Any, row: np.ndarray, bad: set[int], lo: float, hi: float) -> bool:
    """One answer of a burst: a NaN request must fail alone, the others be clamped. True if answered."""
    if i in bad:
        if not isinstance(reply, Exception):
            raise ExerciseError(
                "a request holding a NaN was answered; it must get an error response "
                "of its own (clamping NaN has no meaning)"
            )
        if "nan" not in str(reply).lower():
            raise ExerciseError(f"the error for a NaN request should say NaN; it says: {reply}")
        return False
    if isinstance(reply, Exception):
        raise ExerciseError(
            f"request {i} of a burst failed although its data was fine: {reply}. A bad "
            "batch-mate must fail alone (lab_send_error on its response, then go on)"
        )
    if not np.array_equal(reply["OUTPUT0"], np.clip(row, np.float32(lo), np.float32(hi))):
        raise ExerciseError(
            f"request {i} of a burst got {reply['OUTPUT0'][0, :4]}, expected "
            f"{np.clip(row, lo, hi)[0, :4]}: did the requests' outputs get mixed up?"
        )
    return True


def _check_bursts(own: Any, rng: np.random.Generator, lo: float, hi: float) -> tuple[int, int, list[int]]:
    """Bursts with two NaN requests each, until the statistics show a batch larger than 1."""
    from lab_backends.lessons.authoring import send_together

    before = own.statistics("clip_main")["model_stats"][0]
    bad = {2, 7}
    answered = failed = 0
    grown: dict[int, int] = {}
    for _ in range(BURST_TRIES):
        rows = [(rng.standard_normal((1, 9)) * 3).astype(np.float32) for _ in range(BURST_SIZE)]
        for i in bad:
            rows[i][0, 4] = np.nan
        for i, reply in enumerate(send_together(own, "clip_main", [{"INPUT0": r} for r in rows])):
            if _check_burst_reply(i, reply, rows[i], bad, lo, hi):
                answered += 1
            else:
                failed += 1
        grown = {
            size: n - _batch_executions(before).get(size, 0)
            for size, n in _batch_executions(own.statistics("clip_main")["model_stats"][0]).items()
        }
        if any(size > 1 and n > 0 for size, n in grown.items()):
            return answered, failed, sorted(size for size, n in grown.items() if n > 0)
    raise ExerciseError(
        f"after {BURST_TRIES} bursts of {BURST_SIZE} requests the statistics show no batch "
        f"larger than 1 ({grown}): report each batch with "
        "TRITONBACKEND_ModelInstanceReportBatchStatistics"
    )


def _check_fp64_refused(own: Any, x: np.ndarray) -> None:
    from tritonclient.utils import InferenceServerException

    from lab_backends.client.infer import infer

    try:
        infer(own, "clip_fp64", {"INPUT0": x.astype(np.float64)})
    except InferenceServerException as exc:
        if "FP32" not in exc.message():
            raise ExerciseError(
                f"an FP64 input was refused, but the message does not say FP32 is needed: {exc.message()}"
            ) from exc
    else:
        raise ExerciseError(
            "an FP64 INPUT0 was answered: check the dtype (lab_get_input does) and answer "
            "that request with an error"
        )
