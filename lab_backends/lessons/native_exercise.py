"""Notebook 09c's exercise (``tf_gather_scatter``): the gather and the scatter of the C TensorFlow backend.

The learner completes ``exercises/tf_gather_scatter.c`` next to the notebook, in place: the two
functions ``gather()`` and ``scatter()`` of the backend ``lab_tensorflow``
(``c_backends/frameworks/lab_tensorflow/``), left as ``TODO(exercise)`` (handed out by set-up,
:mod:`lab_backends.lessons.handout`; "not attempted" only while the file is the skeleton as shipped).
The file holds only them: the rest of the backend is ``lab_tensorflow.c``, built with it in place of
the backend's own ``lab_tensorflow_batch.c`` (the reference answer). :func:`check_gather_scatter`
then does what a reviewer and a test server would, in the order a learner fixes things:

1. builds it with ``lab_tensorflow.c`` as :mod:`lab_backends.server.native_backends` builds
   ``lab_tensorflow`` (``gcc -Wall -Wextra -Werror -Wl,-z,defs`` against the wheel's TensorFlow C API,
   rpath to it), so the compiler's lines name the learner's file;
2. serves it as backend ``tf_exercise`` on a server *of its own* (a double free in a scatter kills
   tritonserver, which must not be the learner's), beside ``tf_reference``: digits_tf_native's
   config on the built ``lab_tensorflow``, whose answers are the reference;
3. one request of 1 row, then one of 5 rows alone (a gather or scatter that moves one row per
   request fails here, whatever the batcher does), then bursts of concurrent requests of 1 to 8
   rows until an execution held several requests (rows shifted between requests: a wrong offset);
4. a burst on the same model whose config (``dims: [-1]``, ``allow_ragged_batch``, as
   ``tests/test_native_frameworks.py`` does) lets a request with rows of 63 values reach the backend
   inside a batch: it must fail alone, its batch-mates answered;
5. many batches of 64 rows while the server's RSS is watched: a ``TF_Tensor`` (or a buffer) leaked
   per batch grows it by about the bytes gathered (:data:`LEAK_BOUND`, measured: see there).

The backend is built with AddressSanitizer and its server preloads the runtime
(:mod:`lab_backends.server.sanitizer`): a write past the batch tensor, a use after free or a double
free stops the server at the fault, and the verdict names it with the line of the learner's file, or of
``lab_tensorflow.c`` and where the learner's file freed the block first
(:mod:`lab_backends.lessons.native_faults`). Every request has a deadline (:data:`REQUEST_DEADLINE_S`),
so a server that hangs (a heap glibc found corrupted, an Execute that never returns) gets a verdict too,
and the ``with TritonServer`` block stops it by PID, SIGKILL after its exit timeout.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.digits import ARTIFACT_DIR, load_split, normalize
from lab_backends.errors import BackendBuildError, ExerciseError, ModelLoadError
from lab_backends.lessons.authoring import send_together
from lab_backends.lessons.handout import handout, read_c_answer
from lab_backends.lessons.native_faults import fault
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import cbackend, native_backends, sanitizer
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.triton_server import TritonServer

NAME = "tf_gather_scatter"
BACKEND = MODEL = "tf_exercise"
REFERENCE_MODEL = "tf_reference"
NATIVE = "digits_tf_native"
HANDOUT = handout(NAME)
#: The skeleton as shipped (the learner edits a copy: ``exercises/tf_gather_scatter.c`` next to notebook 09c).
SKELETON = HANDOUT.shipped
NOT_ATTEMPTED = ("complete gather() and scatter(), the two TODO(exercise) places in exercises/tf_gather_scatter.c, "
                 "next to this notebook (the marks may stay), save it, then run this cell again")
TASK = (
    "Complete exercises/tf_gather_scatter.c (next to notebook 09c): the bodies of gather() and scatter() of "
    "the C backend lab_tensorflow, whose rest is built with your file. gather() puts every good request's rows "
    "(a request may carry several: its first dimension) into one TF_Tensor, each at its offset, and fails alone "
    "a request whose rows the model cannot take; scatter() answers each request with its own rows of the result, "
    "shaped [its rows, 10]. Leak nothing per batch. Then call exercises.check('tf_gather_scatter', "
    "'exercises/tf_gather_scatter.c'). The checker builds it with the rest of lab_tensorflow against "
    "TensorFlow's C API with -Wall -Wextra -Werror -Wl,-z,defs, serves it on a server of its own, compares "
    "concurrent requests of 1 to 8 rows with digits_tf_native, sends a bad row inside a batch, and watches the "
    "server's memory over many batches."
)
TOLERANCE = 1e-4
#: Every request's deadline (gRPC ``client_timeout``): a request of 64 rows takes milliseconds, under
#: AddressSanitizer too; a server that has not answered in this time never will (see native_faults).
REQUEST_DEADLINE_S = 10.0
#: A burst: requests of these many rows (1..8, neighbours always different), sent at once.
BURST_ROWS = (3, 1, 8, 2, 5, 7, 4, 6, 1, 3, 8, 5, 2, 7, 6, 4, 2, 8, 1, 5, 3, 6, 4, 7)
BURST_TRIES = 4
BAD_BURST = 8
BAD_INDEX = 5
#: The leak probe: requests of 64 rows (one batch each: max_batch_size), first to warm up, then measured.
LEAK_ROWS = 64
LEAK_WARMUP, LEAK_REQUESTS = 60, 400
#: Refused when the server's RSS grows by more than this fraction of the bytes gathered while measured
#: (400 x 64 rows x 256 B = 6.6 MB). Measured on this project's 2 cores (see tests/exercise_cases):
#: the reference grew 0.0-0.4 MB, a per-request TF_Tensor never deleted 6.4-6.8 MB (about 1.0 of them).
LEAK_BOUND = 0.4
#: Windows of LEAK_REQUESTS batches measured at most: a leak grows the RSS in every window, a one-off step
#: (an allocator arena, a thread's first stack) in one only. Measured: the reference once grew 3.4 MB in one
#: window (make test run 57, 2026-12-03), so one window over the bound is measured again before a refusal.
LEAK_WINDOWS = 2


def read_answer(answer: Any) -> tuple[Path, str]:
    """The learner's C file and its text; ``NotImplementedError`` while it is the skeleton as shipped
    (compared with the package's copy, never with the file being edited in place)."""
    return read_c_answer(answer, HANDOUT, "09c", NOT_ATTEMPTED)


def build(source: Path, backend_dir: Path, name: str = BACKEND) -> Path:
    """``source`` (gather and scatter) built with the rest of lab_tensorflow as lab_tensorflow is (its
    flags, its local headers, TensorFlow's C API), with AddressSanitizer."""
    runtime = native_backends.tensorflow_runtime()
    return cbackend.build(source, name, backend_dir, extra_flags=("-Werror", *sanitizer.COMPILE_FLAGS),
                          include_dirs=(cbackend.INCLUDE_DIR, native_backends.tensorflow_source().parent,
                                        runtime.include_dir),
                          link_flags=runtime.link_flags(), more_sources=(native_backends.tensorflow_source(),))


def write_models(repo: Path, backend_dir: Path) -> None:
    """``tf_exercise`` (the learner's backend, ragged rows let through) and ``tf_reference``
    (digits_tf_native on the built lab_tensorflow), both on the set-up's SavedModel."""
    reference_lib = native_backends.build_tensorflow()  # stale-checked: set-up built it
    (backend_dir / native_backends.TENSORFLOW_BACKEND).symlink_to(reference_lib.parent, target_is_directory=True)
    for name, backend in ((MODEL, BACKEND), (REFERENCE_MODEL, native_backends.TENSORFLOW_BACKEND)):
        config = read_config(MODEL_REPOSITORY / NATIVE)
        config.name, config.backend = name, backend
        if name == MODEL:  # rows of any length reach the backend, in shared batches (core backend_model.cc:802-818)
            config.input[0].dims[:] = [-1]
            config.input[0].allow_ragged_batch = True
            config.dynamic_batching.max_queue_delay_microseconds = 50_000
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config_text(config))
        (repo / name / "1" / "model.savedmodel").symlink_to(ARTIFACT_DIR / "model.savedmodel", target_is_directory=True)


def check_gather_scatter(answer: Any, server: Any = None) -> str:
    """Build, serve and drive the learner's backend; ``server`` is unused (we start our own)."""
    del server  # a backend that crashes must not take the learner's server with it
    path, _ = read_answer(answer)
    pixels = normalize(load_split().test_images)
    with tempfile.TemporaryDirectory(prefix="exercise-tf-") as tmp:
        repo, backends = Path(tmp) / "models", Path(tmp) / "backends"
        try:
            build(path, backends)
        except BackendBuildError as exc:
            raise ExerciseError(f"your {path.name} does not build with -Wall -Wextra -Werror -Wl,-z,defs:\n"
                                f"{exc}") from exc
        write_models(repo, backends)
        with TritonServer(repo, models=[REFERENCE_MODEL], backend_dir=backends, target="local",
                          exit_timeout_s=2, address_sanitizer=True) as own:
            try:
                own.load_model(MODEL)
            except ModelLoadError as exc:
                raise ExerciseError(f"the server could not load your backend: {exc.reason}") from exc
            want = np.concatenate([infer(own, REFERENCE_MODEL, {"PIXELS": pixels[i:i + 64]},
                                         client_timeout=REQUEST_DEADLINE_S)["LOGITS"]
                                   for i in range(0, len(pixels), 64)])
            probe = Probe(own, pixels, want, (path.name, native_backends.tensorflow_source().name))
            probe.alone(0, 1)
            probe.alone(40, 5)
            mixed = probe.bursts()
            probe.bad_row()
            growth, gathered = probe.leak()
    return (f"{path.name} built with the rest of lab_tensorflow, -Werror, against TensorFlow's C API; requests "
            f"of 1 and 5 rows alone and {mixed} concurrent requests of 1 to 8 rows in shared batches all equal "
            f"digits_tf_native's logits; a row of 63 values failed alone in its batch; RSS grew "
            f"{growth / 1e6:.1f} MB over {LEAK_REQUESTS} batches that gathered {gathered / 1e6:.1f} MB: nothing "
            "leaked per batch.")


class Probe:
    """The requests of one check, against the learner's model on ``own``; ``want``: the reference logits;
    ``source_name``: the learner's file name, then the rest of the backend's, which a memory error's
    report is searched for."""

    def __init__(self, own: Any, pixels: np.ndarray, want: np.ndarray,
                 source_name: str | tuple[str, ...] = "") -> None:
        self.own, self.pixels, self.want, self.source_name = own, pixels, want, source_name

    def _died(self, when: str, failure: Any = None) -> None:
        """Raise the verdict when the server faulted (see native_faults), or when ``failure`` (a request's
        error) is a deadline that passed on a server that shows no fault: Execute never answered."""
        found = fault(self.own, self.source_name)
        rest = self.source_name[1:] if isinstance(self.source_name, tuple) else ()
        if found is not None and any(f" at {name}:" in found for name in rest):
            found += " (the rest of the backend, built with your file: it tripped over what your code left)"
        if found is not None:
            raise ExerciseError(
                f"{found} {when}: your backend runs inside the server. Look for a write past the batch tensor "
                "(gather: each request's rows x row bytes, at its offset), a response used after ResponseSend, or "
                "a tensor deleted twice (Execute deletes the batch and the result itself)")
        if failure is not None and ("DEADLINE_EXCEEDED" in str(failure) or isinstance(failure, TimeoutError)):
            raise ExerciseError(
                f"no answer {when} within {REQUEST_DEADLINE_S:.0f} s, and the server shows no crash: Execute never "
                "returned or never sent a response. Every good request needs one ResponseSend, every request "
                "one release, and Execute must return")

    def _compare(self, got: Any, start: int, rows: int, what: str, batched: bool) -> None:
        if isinstance(got, Exception):
            self._died(f"during {what}", got)
            message = got.message() if isinstance(got, InferenceServerException) else str(got)
            raise ExerciseError(f"{what} failed: {message}. Every good request must be answered: gather each "
                                "one's rows and scatter them back")
        want = self.want[start:start + rows]
        if got.shape != want.shape:
            raise ExerciseError(
                f"{what}: a request of {rows} rows got LOGITS of shape {list(got.shape)}, expected {list(want.shape)}. "
                "A request may carry several rows (its own batch size, slots[i].input.shape[0]): gather all of "
                "them and answer [its rows, 10], not one row per request")
        if np.abs(got - want).max() < TOLERANCE:
            return
        bad = int(np.argmax(np.abs(got - want).max(axis=1) >= TOLERANCE))
        elsewhere = np.abs(self.want - got[bad]).max(axis=1) < TOLERANCE
        if not batched:
            raise ExerciseError(
                f"{what}: row {bad} of a request of {rows} rows differs from digits_tf_native's (max diff "
                f"{np.abs(got - want).max():.3g}). A request may carry several rows: gather all of them, in order, "
                "and scatter all of them back, not one row per request")
        source = (f"it holds digit {int(np.argmax(elsewhere))}'s logits, another request's" if elsewhere.any()
                  else "it matches no digit sent")
        raise ExerciseError(
            f"{what}: row {bad} of a request of {rows} rows is wrong ({source}): rows shifted between requests. "
            "A request's rows start at its offset, the sum of the rows of the requests before it in the batch "
            "(slots[i].offset), in the gather and in the scatter alike")

    def alone(self, start: int, rows: int) -> None:
        """One request, nothing else in flight: a batch of one request."""
        try:
            got: Any = infer(self.own, MODEL, {"PIXELS": self.pixels[start:start + rows]},
                             client_timeout=REQUEST_DEADLINE_S)["LOGITS"]
        except InferenceServerException as exc:
            got = exc
        self._compare(got, start, rows, f"one request of {rows} row{'s' * (rows > 1)} alone", batched=False)

    def _together(self, requests: list[dict[str, np.ndarray]], what: str) -> list[Any]:
        """``send_together`` with every request's deadline; a burst that gets no answer is judged."""
        try:
            return send_together(self.own, MODEL, requests, timeout_s=REQUEST_DEADLINE_S)
        except TimeoutError as exc:
            self._died(f"during {what}", exc)
            raise ExerciseError(str(exc)) from exc  # not reached: _died judges a timeout

    def _executions(self) -> int:
        return int(self.own.statistics(MODEL)["model_stats"][0]["execution_count"])

    def bursts(self) -> int:
        """Bursts of BURST_ROWS until one execution held several requests; every answer compared."""
        sent = 0
        for attempt in range(BURST_TRIES):
            starts = [(37 * (attempt * len(BURST_ROWS) + i)) % (len(self.pixels) - 8) for i in range(len(BURST_ROWS))]
            before = self._executions()
            replies = self._together([{"PIXELS": self.pixels[s:s + n]} for s, n in zip(starts, BURST_ROWS)],
                                     f"a burst of {len(BURST_ROWS)} requests")
            for i, (reply, s, n) in enumerate(zip(replies, starts, BURST_ROWS)):
                got = reply if isinstance(reply, Exception) else reply["LOGITS"]
                self._compare(got, s, n, f"request {i} of a burst of {len(BURST_ROWS)}", batched=True)
            sent += len(BURST_ROWS)
            if self._executions() - before < len(BURST_ROWS):
                return sent
        raise ExerciseError(f"after {BURST_TRIES} bursts every execution held one request: the batcher did not "
                            "batch (the server may be very busy); run the check again")

    def bad_row(self) -> None:
        """A burst with one request of rows of 63 values: it must fail alone, the others be answered."""
        for _ in range(BURST_TRIES):
            requests = [self.pixels[10 * i:10 * i + 1 + i % 4] for i in range(BAD_BURST)]
            requests[BAD_INDEX] = np.zeros((2, 63), np.float32)
            before = self._executions()
            replies = self._together([{"PIXELS": r} for r in requests], "a burst with a bad row")
            if not isinstance(replies[BAD_INDEX], Exception):
                raise ExerciseError(
                    "a request of rows of 63 values (the model takes 64) was answered: gather must check each "
                    "request's row shape against in->row_shape and fail that request alone")
            self._died("after a request with rows of 63 values")
            for i, reply in enumerate(replies):
                if i != BAD_INDEX and isinstance(reply, Exception):
                    message = reply.message() if isinstance(reply, InferenceServerException) else str(reply)
                    raise ExerciseError(
                        f"request {i} of a batch failed although its rows were fine, because a batch-mate's rows "
                        f"had 63 values: {message}. One request's error must not fail its batch: answer it alone "
                        "(fail(&slots[i], err); continue) and gather the others")
                if i != BAD_INDEX:
                    self._compare(reply["LOGITS"], 10 * i, 1 + i % 4, f"request {i} beside a bad row", batched=True)
            if self._executions() - before < BAD_BURST:
                return
        raise ExerciseError(f"after {BURST_TRIES} bursts the bad row never shared a batch; run the check again")

    def _send_batches(self, count: int) -> None:
        batch = {"PIXELS": self.pixels[:LEAK_ROWS]}
        for _ in range(count):
            try:
                infer(self.own, MODEL, batch, client_timeout=REQUEST_DEADLINE_S)
            except InferenceServerException as exc:
                self._died("while batches of 64 rows were sent", exc)
                raise ExerciseError(f"a request of 64 rows failed: {exc.message()}") from exc

    def leak(self) -> tuple[int, int]:
        """(RSS growth, bytes gathered) over LEAK_REQUESTS batches of 64 rows, after LEAK_WARMUP of them.

        Refused only when every one of up to LEAK_WINDOWS windows grew past the bound: a leak per batch
        does so in each window, a one-off step in the RSS does not. The second window runs only after a
        first one over the bound (the audit's leaking answer takes it every time)."""
        process = psutil.Process(self.own.pid)
        self._send_batches(LEAK_WARMUP)
        gathered = LEAK_REQUESTS * self.pixels[:LEAK_ROWS].nbytes
        growths: list[int] = []
        while len(growths) < LEAK_WINDOWS:
            before = process.memory_info().rss
            self._send_batches(LEAK_REQUESTS)
            growths.append(process.memory_info().rss - before)
            if growths[-1] <= LEAK_BOUND * gathered:
                return growths[-1], gathered
        raise ExerciseError(
            f"the server's memory grew {' MB, then '.join(f'{g / 1e6:.1f}' for g in growths)} MB over windows of "
            f"{LEAK_REQUESTS} batches of {LEAK_ROWS} rows that each gathered {gathered / 1e6:.1f} MB: something is "
            "leaked per batch. Every TF_Tensor you allocate (TF_AllocateTensor, TF_NewTensor) needs its "
            "TF_DeleteTensor, and Execute already deletes the batch you return")
