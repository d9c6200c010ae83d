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
5. many batches of 64 rows, then the blocks the backend still holds are counted: the build links
   ``c_backends/checks/block_census.c``, which remembers every TF_Tensor and every malloc'd block the
   backend's own code allocates and has not freed (the linker's ``--wrap``: see that file). More blocks
   held after all the requests than after the first (:data:`LEAK_BLOCKS`) are a leak per request or
   per batch, counted, not guessed from the server's memory.

The backend is built with AddressSanitizer and its server preloads the runtime
(:mod:`lab_backends.server.sanitizer`): a write past the batch tensor, a use after free or a double
free stops the server at the fault, and the verdict names it with the line of the learner's file, or of
``lab_tensorflow.c`` and where the learner's file freed the block first
(:mod:`lab_backends.lessons.native_faults`). Every request has a deadline (:data:`REQUEST_DEADLINE_S`),
so a server that hangs (a heap glibc found corrupted, an Execute that never returns) gets a verdict too,
and the ``with TritonServer`` block stops it by PID, SIGKILL after its exit timeout. Step 3's requests
and these verdicts are 09d's too (:mod:`lab_backends.lessons.native_probe`).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.digits import ARTIFACT_DIR, load_split, normalize
from lab_backends.errors import BackendBuildError, ExerciseError, ModelLoadError
from lab_backends.lessons.handout import handout, read_c_answer
from lab_backends.lessons.native_faults import REQUEST_DEADLINE_S
from lab_backends.lessons.native_probe import BURST_TRIES, TOLERANCE, Hints, ServedProbe, reference_logits
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
    "concurrent requests of 1 to 8 rows with digits_tf_native, sends a bad row inside a batch, and counts the "
    "blocks your backend still holds after many batches."
)
#: A burst: requests of these many rows (1..8, neighbours always different), sent at once.
BURST_ROWS = (3, 1, 8, 2, 5, 7, 4, 6, 1, 3, 8, 5, 2, 7, 6, 4, 2, 8, 1, 5, 3, 6, 4, 7)
BAD_BURST = 8
BAD_INDEX = 5
#: The leak probe: requests of 64 rows (one batch each: max_batch_size), after the bursts.
LEAK_ROWS = 64
LEAK_REQUESTS = 100
#: Refused when the backend holds more blocks than this after every request than after the first. A
#: correct answer holds the same blocks between batches (a batch still finishing when the count is read
#: holds its batch tensor, its result and a few buffers); a leak per request or per batch holds one more
#: for each of the last LEAK_REQUESTS batches alone.
LEAK_BLOCKS = 10
#: The counter block_census.c writes (an 8-byte count in a shared mapping); this value means "more than it can hold".
CENSUS_FULL = 2**64 - 1


#: The checker's census of the blocks the backend holds (its module docstring says why and how).
CENSUS_SOURCE = cbackend.C_BACKENDS_DIR / "checks" / "block_census.c"
CENSUS_WRAPPED = ("TF_AllocateTensor", "TF_NewTensor", "TF_DeleteTensor", "malloc", "calloc", "realloc",
                  "aligned_alloc", "posix_memalign", "free")


def read_answer(answer: Any) -> tuple[Path, str]:
    """The learner's C file and its text; ``NotImplementedError`` while it is the skeleton as shipped
    (compared with the package's copy, never with the file being edited in place)."""
    return read_c_answer(answer, HANDOUT, "09c", NOT_ATTEMPTED)


def build(source: Path, backend_dir: Path, census: Path, name: str = BACKEND) -> Path:
    """``source`` (gather and scatter) built with the rest of lab_tensorflow as lab_tensorflow is (its
    flags, its local headers, TensorFlow's C API), with AddressSanitizer, and with the block census
    counting into the file ``census``."""
    runtime = native_backends.tensorflow_runtime()
    wrapped = ",".join(f"--wrap={f}" for f in CENSUS_WRAPPED)
    return cbackend.build(source, name, backend_dir,
                          extra_flags=("-Werror", *sanitizer.COMPILE_FLAGS, f'-DLAB_CENSUS_FILE="{census}"'),
                          include_dirs=(cbackend.INCLUDE_DIR, native_backends.tensorflow_source().parent,
                                        runtime.include_dir),
                          link_flags=(*runtime.link_flags(), f"-Wl,{wrapped}"),
                          more_sources=(native_backends.tensorflow_source(), CENSUS_SOURCE))


def blocks_held(census: Path) -> int:
    """How many blocks the backend's code allocated and still holds (0 before its first allocation)."""
    try:
        return int.from_bytes(census.read_bytes()[:8], sys.byteorder)
    except FileNotFoundError:
        return 0


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
        census = Path(tmp) / "census"
        try:
            build(path, backends, census)
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
            want = reference_logits(own, REFERENCE_MODEL, pixels)
            probe = Probe(own, pixels, want, (path.name, native_backends.tensorflow_source().name))
            probe.alone(0, 1)
            first = blocks_held(census)
            probe.alone(40, 5)
            mixed = probe.bursts(BURST_ROWS)
            probe.bad_row()
            probe.batches(LEAK_REQUESTS)
            grown = blocks_held(census) - first
    if grown > LEAK_BLOCKS:
        held = "more than 65,000" if first + grown >= CENSUS_FULL else f"{grown}"
        raise ExerciseError(
            f"after the bursts and {LEAK_REQUESTS} batches more, your backend holds {held} more blocks than "
            "after its first request (TF_Tensors from TF_AllocateTensor or TF_NewTensor, or malloc'd buffers, never "
            "deleted or freed): something is leaked per request or per batch. Every TF_Tensor you allocate needs "
            "its TF_DeleteTensor (Execute already deletes the batch you return), every malloc its free")
    return (f"{path.name} built with the rest of lab_tensorflow, -Werror, against TensorFlow's C API; requests "
            f"of 1 and 5 rows alone and {mixed} concurrent requests of 1 to 8 rows in shared batches all equal "
            f"digits_tf_native's logits; a row of 63 values failed alone in its batch; after {LEAK_REQUESTS} more "
            f"batches of 64 rows your backend held {max(grown, 0)} more blocks than after its first request: "
            "nothing leaked.")


HINTS = Hints(
    reference=NATIVE, runs="your backend",
    crash=("Look for a write past the batch tensor (gather: each request's rows x row bytes, at its offset), a "
           "response used after ResponseSend, or a tensor deleted twice (Execute deletes the batch and the result "
           "itself)"),
    hang=("Execute never returned or never sent a response. Every good request needs one ResponseSend, every "
          "request one release, and Execute must return"),
    failed="Every good request must be answered: gather each one's rows and scatter them back",
    shape=("A request may carry several rows (its own batch size, slots[i].input.shape[0]): gather all of them and "
           "answer [its rows, 10], not one row per request"))


class Probe(ServedProbe):
    """The requests of one check, against the learner's model on ``own`` (:class:`ServedProbe`'s, a bad row
    inside a batch, and the leak probe); ``want``: the reference logits; ``sources``: the learner's file
    name, then the rest of the backend's."""

    def __init__(self, own: Any, pixels: np.ndarray, want: np.ndarray, sources: tuple[str, ...]) -> None:
        super().__init__(own, MODEL, pixels, want, sources, HINTS)

    def wrong_values(self, got: np.ndarray, want: np.ndarray, rows: int, what: str, batched: bool) -> None:
        """Rows that differ: alone, rows lost in the request; in a batch, whose rows they are."""
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

    def bad_row(self) -> None:
        """A burst with one request of rows of 63 values: it must fail alone, the others be answered."""
        for _ in range(BURST_TRIES):
            requests = [self.pixels[10 * i:10 * i + 1 + i % 4] for i in range(BAD_BURST)]
            requests[BAD_INDEX] = np.zeros((2, 63), np.float32)
            before = self.counts()
            replies = self.together([{"PIXELS": r} for r in requests], "a burst with a bad row")
            if not isinstance(replies[BAD_INDEX], Exception):
                raise ExerciseError(
                    "a request of rows of 63 values (the model takes 64) was answered: gather must check each "
                    "request's row shape against in->row_shape and fail that request alone")
            self.died("after a request with rows of 63 values")
            for i, reply in enumerate(replies):
                if i != BAD_INDEX and isinstance(reply, Exception):
                    message = reply.message() if isinstance(reply, InferenceServerException) else str(reply)
                    raise ExerciseError(
                        f"request {i} of a batch failed although its rows were fine, because a batch-mate's rows "
                        f"had 63 values: {message}. One request's error must not fail its batch: answer it alone "
                        "(fail(&slots[i], err); continue) and gather the others")
                if i != BAD_INDEX:
                    self.compare(reply["LOGITS"], 10 * i, 1 + i % 4, f"request {i} beside a bad row", batched=True)
            good_rows = sum(len(r) for i, r in enumerate(requests) if i != BAD_INDEX)
            if self.counts_after(before, good_rows).executions - before.executions < BAD_BURST:
                return
        raise ExerciseError(f"after {BURST_TRIES} bursts the bad row never shared a batch; run the check again")

    def batches(self, count: int) -> None:
        """``count`` requests of 64 rows, one after another: one batch each."""
        batch = {"PIXELS": self.pixels[:LEAK_ROWS]}
        for _ in range(count):
            try:
                infer(self.own, MODEL, batch, client_timeout=REQUEST_DEADLINE_S)
            except InferenceServerException as exc:
                self.died("while batches of 64 rows were sent", exc)
                raise ExerciseError(f"a request of 64 rows failed: {exc.message()}") from exc
