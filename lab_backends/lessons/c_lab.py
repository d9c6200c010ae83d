"""Notebook 09's exercise: a C backend ``clip`` written by the learner, checked on a real server.

The learner completes ``exercises/clip.c`` next to the notebook, in place (a skeleton with
``TODO(exercise)`` marks, handed out by set-up: :mod:`lab_backends.lessons.handout`): the four functions
of backend ``clip`` the exercise asks for; the rest of it, ``TRITONBACKEND_ModelInstanceExecute``
included, is ``c_backends/include/clip_backend.h``, which the file includes (the backend's own
``c_backends/clip/clip.c`` is the reference answer). :func:`check_clip_answer` then does what a reviewer
and a test server would:

1. reads the source: the skeleton as shipped (compared with the package's copy, never with the file
   being edited) -> "not attempted"; then the ownership rules a reviewer
   would insist on, each refused with its line: a response deleted after it was sent (the double
   free the lab's own backends used to have), the error of a failed send never freed, a
   ``ModelFinalize`` that does not free the state ``ModelInitialize`` set (:mod:`.c_source`);
2. builds it (with the header's rest) with ``gcc -Wall -Wextra -Werror`` and ``-Wl,-z,defs``
   (:mod:`lab_backends.server.cbackend`), so warnings and misspelled API names fail the check at build time;
3. serves it on a server *of its own* (a segfaulting backend must not take the learner's server
   down) with bounds drawn at random (a hard-coded answer cannot pass), and checks: a bound that
   is not a number, a missing bound and ``lo > hi`` each fail the load with a reason naming the
   parameter(s) (matched as words in Triton's reason: every load error contains "load", so a
   plain substring test for "lo" could never fail); batched requests are clamped exactly; in
   bursts of requests of 1 to 3 rows, requests holding a NaN get their own error while their
   batch-mates are answered, and the batch statistics add up to the rows answered (``*items`` is
   each request's first dimension, not 1); a request whose dtype the backend does not take (the
   config says FP64, as ``c_scale_fp64`` does in the tests: Triton itself refuses a dtype that
   contradicts the config, so only a config that lets it through reaches the backend) gets the
   backend's error and the server keeps serving.

The backend is built with AddressSanitizer and served with its runtime preloaded, and every request has
a deadline: a write out of bounds, a double free or a hang is named with the line of the learner's file
(:mod:`lab_backends.lessons.native_faults`), within seconds.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.errors import BackendBuildError, ExerciseError, ModelLoadError
from lab_backends.lessons import c_source, native_faults
from lab_backends.lessons.authoring import send_together
from lab_backends.lessons.handout import handout, read_c_answer
from lab_backends.server import cbackend, sanitizer
from lab_backends.server.repository import ModelConfig, config_text
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll

NAME = "clip_backend"
BACKEND = "clip"
HANDOUT = handout(NAME)
#: The skeleton as shipped (the learner edits a copy: ``exercises/clip.c`` next to notebook 09).
SKELETON = HANDOUT.shipped
TODO_MARK = "TODO(exercise)"
#: Every request's deadline: a clip.c that hangs or corrupts the server gets a verdict, not a wait for ever.
DEADLINE_S = native_faults.REQUEST_DEADLINE_S
#: What to look for when the backend crashed or corrupted the server (named by native_faults.named).
FAULT_ADVICE = ("Look for a write past an output buffer (its size is the request's element count times 4 bytes), "
                "a response used or deleted after ResponseSend, or a state freed twice")
#: What the checker says while clip.c is the untouched skeleton.
NOT_ATTEMPTED = (f"complete the four {TODO_MARK} places in exercises/clip.c, next to this notebook (the marks may "
                 "stay), save it, then run this cell again")
TASK = (
    "Complete exercises/clip.c (next to notebook 09), a C backend 'clip': OUTPUT0 = INPUT0 clamped to [lo, hi] "
    "elementwise (FP32 [batch, n]), with lo and hi read from the model config's parameters in ModelInitialize "
    "(a missing or non-numeric bound, or lo > hi, fails the load with a message naming it) and freed in ModelFinalize. "
    "A request whose INPUT0 is not FP32 or holds a NaN gets its own error response; the rest of its batch is "
    "answered, and the batch statistics count every row. A failed send leaves the response to Triton and the "
    "error to you. Then call exercises.check('clip_backend', 'exercises/clip.c'). The checker reads the "
    "ownership rules from your source, builds it with -Wall -Wextra -Werror -Wl,-z,defs, serves it on a server "
    "of its own and sends batched, concurrent and bad requests."
)
#: Executions with more than one request: the burst is repeated at most this often to see one.
BURST_TRIES = 4
BURST_SIZE = 12
#: How long the batch statistics may lag behind the last answer (the backend reports them after
#: sending its responses) before a shortfall counts.
STATS_WAIT_S = 3.0


def _config(name: str, lo: str | None, hi: str | None, dtype: str = "TYPE_FP32") -> Any:
    config = ModelConfig(name=name, backend=BACKEND, max_batch_size=16)
    config.input.add(name="INPUT0", data_type=model_config_pb2.DataType.Value(dtype), dims=[-1])
    config.output.add(name="OUTPUT0", data_type=model_config_pb2.DataType.Value(dtype), dims=[-1])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    config.dynamic_batching.max_queue_delay_microseconds = 20_000
    for key, value in (("lo", lo), ("hi", hi)):
        if value is not None:
            config.parameters[key].string_value = value
    return config


def _write(repo: Path, config: Any) -> None:
    (repo / config.name / "1").mkdir(parents=True, exist_ok=True)
    (repo / config.name / "config.pbtxt").write_text(config_text(config))


def read_answer(answer: Any) -> tuple[Path, str]:
    """The learner's C file and its text; ``NotImplementedError`` while it is still the skeleton.

    "Not attempted" means the file is the skeleton as shipped (whitespace aside), nothing else:
    a finished clip.c may well keep the skeleton's comments, ``TODO(exercise)`` marks included, and
    a half-finished one is an attempt whose faults the checks below name. The comparison is with the
    package's copy, so a file edited in place, as notebook 09 says, is judged as what it now is.
    """
    return read_c_answer(answer, HANDOUT, "09", NOT_ATTEMPTED)


def _batch_executions(stats: dict) -> dict[int, int]:
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


def check_clip_answer(answer: Any, server: Any = None) -> str:
    """Build, serve and exercise the learner's clip.c; ``server`` is unused (we start our own).

    In the order a learner fixes things: the ownership rule, the build, the config's bounds, one
    good request, a burst with bad batch-mates, a wrong dtype, and the server still serving.
    """
    del server  # a backend that crashes must not take the learner's server with it
    path, source = read_answer(answer)
    _check_ownership(path.name, source)
    rng = np.random.default_rng()
    lo, hi = round(float(rng.uniform(-3, -0.5)), 2), round(float(rng.uniform(0.5, 3)), 2)
    with tempfile.TemporaryDirectory(prefix="exercise-clip-") as tmp:
        repo, backends = Path(tmp) / "models", Path(tmp) / "backends"
        _build(path, backends)
        _write(repo, _config("clip_main", f"{lo:g}", f"{hi:g}"))
        _write(repo, _config("clip_fp64", f"{lo:g}", f"{hi:g}", dtype="TYPE_FP64"))
        _write(repo, _config("clip_bad_bound", "low", f"{hi:g}"))
        _write(repo, _config("clip_no_hi", f"{lo:g}", None))
        _write(repo, _config("clip_swapped", f"{hi:g}", f"{lo:g}"))
        with (TritonServer(repo, models=[], backend_dir=backends, target="local", address_sanitizer=True) as own,
              native_faults.named(own, path.name, FAULT_ADVICE)):
            _check_loads(own, lo, hi)
            x = (rng.standard_normal((3, 7)) * 3).astype(np.float32)
            want = _check_one_request(own, x, lo, hi)
            answered, failed, sizes = _check_bursts(own, rng, lo, hi, rows_so_far=len(x))
            _check_fp64_refused(own, x)
            again = infer(own, "clip_main", {"INPUT0": x}, client_timeout=DEADLINE_S)["OUTPUT0"]
            if not own.is_ready() or not np.array_equal(again, want):
                raise ExerciseError("after the bad requests the server no longer serves clip_main correctly")
    return (
        f"clip.c built with -Werror and -z defs; lo={lo}, hi={hi} read from the config, bad bounds refused "
        f"by name; {answered} good requests clamped exactly, {failed} NaN requests refused alone in their "
        f"batches (batch sizes {sizes} rows, the statistics adding up to the rows answered), FP64 refused, "
        "the server still serving."
    )


def _check_ownership(filename: str, source: str) -> None:
    """The ownership rules, read from the source before anything is built (one fault at a time)."""
    problems = c_source.responses_deleted_after_send(source)
    if problems:
        raise ExerciseError(
            f"{filename}: {problems[0]}. After ResponseSend the response is Triton's, even when the "
            "send returned an error: log and free the error, never ResponseDelete it"
        )
    leaks = c_source.send_errors_leaked(source)
    if leaks:
        raise ExerciseError(
            f"{filename}: {leaks[0]}: the error object a call returns is yours to free, even when the response "
            "is already Triton's; log it and call TRITONSERVER_ErrorDelete(err) before `continue`"
        )
    if not c_source.finalize_frees_state(source):
        raise ExerciseError(
            f"{filename}: TRITONBACKEND_ModelFinalize does not free the ClipModel that ModelInitialize set: "
            "get it back with TRITONBACKEND_ModelState and free() it, or every unload leaks it"
        )


def _build(path: Path, backends: Path) -> None:
    try:
        cbackend.build(path, BACKEND, backends, extra_flags=("-Werror", *sanitizer.COMPILE_FLAGS))
    except BackendBuildError as exc:
        raise ExerciseError(f"your clip.c does not build with -Wall -Wextra -Werror -Wl,-z,defs:\n{exc}") from exc


def _names(reason: str, *words: str) -> bool:
    """Does Triton's reason name every one of ``words`` as a word ("lo", not the "lo" of "load")?"""
    return all(re.search(rf"(?<![A-Za-z0-9_]){re.escape(w)}(?![A-Za-z0-9_])", reason) for w in words)


#: Configs that must fail to load: (model, what is wrong, the parameters its reason must name).
BAD_CONFIGS = (
    ("clip_bad_bound", "lo='low' (not a number)", ("lo",)),
    ("clip_no_hi", "no 'hi' parameter", ("hi",)),
    ("clip_swapped", "lo > hi", ("lo", "hi")),
)


def _check_loads(own: Any, lo: float, hi: float) -> None:
    """Each bad config must fail the load, its reason naming the parameter(s); good bounds must load."""
    for model, wrong, words in BAD_CONFIGS:
        try:
            own.load_model(model)
        except ModelLoadError as exc:
            if not _names(exc.reason, *words):
                raise ExerciseError(
                    f"a config with {wrong} failed to load, but the reason does not name "
                    f"{' and '.join(repr(w) for w in words)}: {exc.reason}"
                ) from exc
        else:
            raise ExerciseError(
                f"a config with {wrong} loaded: ModelInitialize must refuse it (return an error naming "
                f"{' and '.join(repr(w) for w in words)})"
            )
    for model in ("clip_main", "clip_fp64"):
        try:
            own.load_model(model)
        except ModelLoadError as exc:
            raise ExerciseError(f"the server could not load your backend with lo={lo}, hi={hi}: {exc}") from exc


def _check_one_request(own: Any, x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    want = np.clip(x, np.float32(lo), np.float32(hi))
    try:
        got = infer(own, "clip_main", {"INPUT0": x}, client_timeout=DEADLINE_S)["OUTPUT0"]
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
    want = np.clip(row, np.float32(lo), np.float32(hi))
    if reply["OUTPUT0"].shape != want.shape or not np.array_equal(reply["OUTPUT0"], want):
        raise ExerciseError(
            f"request {i} of a burst ({len(row)} rows) got {reply['OUTPUT0'].ravel()[:4]} (shape "
            f"{list(reply['OUTPUT0'].shape)}), expected {want.ravel()[:4]} (shape {list(want.shape)}): did the "
            "requests' outputs get mixed up?"
        )
    return True


def _batch_counts(own: Any) -> dict[int, int]:
    """clip_main's executions per batch size: what the backend reported."""
    return _batch_executions(own.statistics("clip_main")["model_stats"][0])


def _rows(counts: dict[int, int]) -> int:
    return sum(size * n for size, n in counts.items())


def _counts_once_reported(own: Any, rows: int, what: str) -> dict[int, int]:
    """clip_main's batch counts once they add up to ``rows``, the rows answered since its load.

    A backend sends its responses first and reports the batch afterwards (the reference does:
    ``TRITONBACKEND_ResponseSend`` at clip_backend.c L143, the batch report at L158), so a client can
    hold every answer while the statistics still lack the last batch: a count read then would land
    in the next burst's difference (seen once in a fresh clone's audit: 22 rows for a burst of 19).
    Waiting for the known total, not for quiet, is exact.
    """
    counts = poll(lambda: _batch_counts(own), lambda c: _rows(c) >= rows, STATS_WAIT_S)
    if rows and not counts:  # nothing at all reported: the one fault that is not *items
        raise ExerciseError(
            f"{what} left no batch statistics: report each batch with "
            "TRITONBACKEND_ModelInstanceReportBatchStatistics"
        )
    if _rows(counts) != rows:
        raise ExerciseError(
            f"the batch statistics count {_rows(counts)} rows for {what}: set *items to the request's "
            "first dimension (input.shape[0]), not 1"
        )
    return counts


def _check_bursts(own: Any, rng: np.random.Generator, lo: float, hi: float,
                  rows_so_far: int) -> tuple[int, int, list[int]]:
    """Bursts of 1- to 3-row requests, two holding a NaN, until one execution served several requests.

    After each burst the batch statistics must add up to the rows answered: the backend reports
    ``batch_size`` = the sum of its requests' ``*items``, so ``*items = 1`` shows up as too few rows.
    ``rows_so_far``: the rows clip_main answered before the bursts (its statistics start at its load).
    """
    bad = {2, 7}
    answered = failed = 0
    sizes_seen: set[int] = set()
    for _ in range(BURST_TRIES):
        before = _counts_once_reported(own, rows_so_far, f"the {rows_so_far} rows answered before this burst")
        rows = [(rng.standard_normal((1 + i % 3, 9)) * 3).astype(np.float32) for i in range(BURST_SIZE)]
        for i in bad:
            rows[i][-1, 4] = np.nan
        good_rows = good_requests = 0
        for i, reply in enumerate(send_together(own, "clip_main", [{"INPUT0": r} for r in rows],
                                                   timeout_s=DEADLINE_S)):
            if _check_burst_reply(i, reply, rows[i], bad, lo, hi):
                answered += 1
                good_requests += 1
                good_rows += len(rows[i])
            else:
                failed += 1
        rows_so_far += good_rows
        after = _counts_once_reported(
            own, rows_so_far, f"a burst whose answered requests held {good_rows} rows ({good_requests} requests "
            "of 1 to 3 rows)")
        executions = sum(after.values()) - sum(before.values())  # > 0: the rows above grew
        sizes_seen |= {size for size, n in after.items() if n > before.get(size, 0)}
        if executions < good_requests:  # some execution served several requests
            return answered, failed, sorted(sizes_seen)
    raise ExerciseError(
        f"after {BURST_TRIES} bursts of {BURST_SIZE} requests every execution held one request: keep the "
        "loop over all `count` requests in ModelInstanceExecute (the batcher hands you several at once)"
    )


def _check_fp64_refused(own: Any, x: np.ndarray) -> None:
    try:
        infer(own, "clip_fp64", {"INPUT0": x.astype(np.float64)}, client_timeout=DEADLINE_S)
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
