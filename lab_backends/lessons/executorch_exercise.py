"""Notebook 09d's exercise (``executorch_binding``): the binding of ExecuTorch's runtime inside lab_executorch.

The learner completes ``exercises/executorch_binding.cc`` next to the notebook, in place: ``bind()`` (the
program opened, its method's tensors checked against the config, its memory planned from the method's
metadata, the method loaded) and ``run()`` (the gathered rows set as the input, one execute, the output
read), left as ``TODO(exercise)`` (handed out by set-up, :mod:`lab_backends.lessons.handout`). The rest of
the backend is ``lab_executorch.cc``, built with the learner's file in place of the backend's own
``lab_executorch_binding.cc`` (the reference answer). :func:`check_binding` then, in the order a learner
fixes things:

1. builds it as :mod:`lab_backends.server.executorch_backend` builds lab_executorch (g++ -std=c++17
   -Wall -Wextra -Werror -Wl,-z,defs against the wheel's runtime), with AddressSanitizer, as backend
   ``et_exercise``;
2. serves it on a server *of its own* (a fault in a binding kills tritonserver, which must not be the
   learner's), beside ``et_reference``: digits_et's config on the built lab_executorch;
3. loads configs that contradict the program: an output's dims ([9], the program computes 10), an
   input's type (FP64), a max_batch_size of 128 (the program was exported for at most 64 rows). Each
   load must fail, with one line that names what is wrong (the tensor, or max_batch_size);
4. one request of 1 row, one of 5 rows alone, then bursts of concurrent requests of 1 to 8 rows until an
   execute held several requests: every answer equal to et_reference's (within 1e-4).

The requests, their deadlines and the verdicts on a fault (ASan's report with the line, a crash, a hang)
are 09c's too (:mod:`lab_backends.lessons.native_probe`); this module adds the load and the contradictions.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tritonclient.grpc import model_config_pb2

from lab_backends.digits import executorch_env, load_split, normalize
from lab_backends.errors import BackendBuildError, ExerciseError, ModelLoadError
from lab_backends.lessons.handout import handout, read_c_answer
from lab_backends.lessons.native_probe import Hints, ServedProbe, reference_logits
from lab_backends.paths import MODEL_REPOSITORY, SCRATCH_DIR
from lab_backends.server import executorch_backend, sanitizer
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.triton_server import TritonServer

NAME = "executorch_binding"
BACKEND = MODEL = "et_exercise"
REFERENCE_MODEL = "et_reference"
NATIVE = "digits_et"
HANDOUT = handout(NAME)
SKELETON = HANDOUT.shipped
NOT_ATTEMPTED = ("complete bind() and run(), the two TODO(exercise) places in exercises/executorch_binding.cc, next "
                 "to this notebook (the marks may stay), save it, then run this cell again")
TASK = (
    "Complete exercises/executorch_binding.cc (next to notebook 09d): the bodies of bind() and run() of the "
    "backend lab_executorch, whose rest is built with your file. bind() opens the program, checks its method's "
    "one input and one output against the config (type, dims after the batch, max_batch_size within the "
    "exported batch bound: a mismatch returns one line naming the tensor and the fix), plans the method's "
    "memory from its metadata and loads it; run() sets the gathered rows as the input, executes once and points "
    "at the output's rows. Then call exercises.check('executorch_binding', 'exercises/executorch_binding.cc'). "
    "The checker builds it with AddressSanitizer, serves it on a server of its own, loads configs that "
    "contradict the program, and compares requests of 1 to 8 rows, alone and together, with digits_et."
)


@dataclass(frozen=True)
class Contradiction:
    """A copy of digits_et's config that contradicts its program: the model it is loaded as, the change as
    messages say it, what the load's one line must name, and the change itself."""

    model: str
    change: str
    named: str
    apply: Callable[[model_config_pb2.ModelConfig], None]


def _output_dims_9(config: model_config_pb2.ModelConfig) -> None:
    config.output[0].dims[:] = [9]  # the program computes 10


def _input_fp64(config: model_config_pb2.ModelConfig) -> None:
    config.input[0].data_type = model_config_pb2.DataType.Value("TYPE_FP64")  # the program takes Float


def _max_batch_128(config: model_config_pb2.ModelConfig) -> None:
    config.max_batch_size = 128  # the program was exported for at most 64 rows


CONTRADICTIONS = (Contradiction("et_bad_output", "output dims [9]", "'LOGITS'", _output_dims_9),
                  Contradiction("et_fp64", "input data_type TYPE_FP64", "'PIXELS'", _input_fp64),
                  Contradiction("et_batch128", "max_batch_size 128", "max_batch_size", _max_batch_128))
BURST_ROWS = (3, 1, 8, 2, 5, 7, 4, 6, 1, 3, 8, 5, 2, 7, 6, 4)


def read_answer(answer: Any) -> tuple[Path, str]:
    return read_c_answer(answer, HANDOUT, "09d", NOT_ATTEMPTED)


def matching() -> str:
    """digits_et's config beside its program's sizes (the batch bound first), as a learner compares them."""
    config = read_config(MODEL_REPOSITORY / NATIVE)
    return "; ".join(f"{t.name}: {model_config_pb2.DataType.Name(t.data_type)} dims {list(t.dims)}, the program's "
                     f"sizes {[executorch_env.MAX_BATCH, *t.dims]}" for t in (*config.input, *config.output))


def write_models(repo: Path, backend_dir: Path) -> None:
    """et_exercise (the learner's backend), et_reference (lab_executorch's own) and the contradicting configs."""
    reference_lib = executorch_backend.build()  # stale-checked: set-up built it
    (backend_dir / executorch_backend.NAME).symlink_to(reference_lib.parent, target_is_directory=True)
    changes = {c.model: c.apply for c in CONTRADICTIONS}
    for name in (MODEL, REFERENCE_MODEL, *changes):
        config = read_config(MODEL_REPOSITORY / NATIVE)
        config.name = name
        config.backend = executorch_backend.NAME if name == REFERENCE_MODEL else BACKEND
        config.dynamic_batching.max_queue_delay_microseconds = 50_000  # bursts share executes
        changes.get(name, lambda config: None)(config)
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config_text(config))
        (repo / name / "1" / "model.pte").symlink_to(executorch_env.PLACED)


def check_binding(answer: Any, server: Any = None) -> str:
    """Build, serve and drive the learner's binding; ``server`` is unused (we start our own)."""
    del server  # a binding that crashes must not take the learner's server with it
    path, _ = read_answer(answer)
    pixels = normalize(load_split().test_images)
    with tempfile.TemporaryDirectory(prefix="exercise-et-") as tmp:
        repo, backends = Path(tmp) / "models", Path(tmp) / "backends"
        try:
            executorch_backend.build(backends, binding=path, extra_flags=sanitizer.COMPILE_FLAGS, name=BACKEND,
                                     cache_dir=SCRATCH_DIR / "executorch-exercise")
        except BackendBuildError as exc:
            raise ExerciseError(f"your {path.name} does not build with -Wall -Wextra -Werror -Wl,-z,defs:\n"
                                f"{exc}") from exc
        write_models(repo, backends)
        with TritonServer(repo, models=[REFERENCE_MODEL], backend_dir=backends, target="local",
                          exit_timeout_s=2, address_sanitizer=True) as own:
            judge = Judge(own, pixels, path.name)
            judge.load()
            judge.contradictions()
            judge.alone(0, 1)
            judge.alone(40, 5)
            mixed = judge.bursts(BURST_ROWS)
    return (f"{path.name} built with the rest of lab_executorch, -Werror, with AddressSanitizer; configs that "
            f"contradict the program ({', '.join(c.change for c in CONTRADICTIONS)}) each failed their load naming "
            f"what is wrong; requests of 1 and 5 rows alone and {mixed} concurrent requests of 1 to 8 rows in shared "
            "executes all equal digits_et's logits.")


HINTS = Hints(
    reference=NATIVE, runs="your binding",
    crash=("Look for memory the method points into that bind() let go (every buffer must live in b), a b->input "
           "smaller than the bound's rows, or an output pointer read past its rows"),
    hang="run() never returned",
    failed=("run() must set this batch's rows as the input (in_sizes[0] = rows), execute the method, and point at "
            "its output 0"),
    shape="run() must point at the output's first rows x 10 values, for this batch's rows")


class Judge(ServedProbe):
    """The requests of one check against the learner's model on ``own``: a load, the contradicting
    configs, then :class:`ServedProbe`'s requests."""

    def __init__(self, own: Any, pixels: np.ndarray, source_name: str) -> None:
        super().__init__(own, MODEL, pixels, reference_logits(own, REFERENCE_MODEL, pixels),
                         (source_name, executorch_backend.main_source().name), HINTS)

    def load(self) -> None:
        try:
            self.own.load_model(MODEL)
        except ModelLoadError as exc:
            self.died("while your backend loaded digits_et's program")
            said = exc.reason.splitlines()[0] if exc.reason.strip() else "(no reason given)"
            raise ExerciseError(f"the server could not load digits_et's program with your binding: {said}. Its "
                                f"config matches the program ({matching()}), so bind() must return \"\" for it: "
                                "compare the sizes after the first (the batch bound) with the config's dims, and "
                                "plan every buffer with the size memory_planned_buffer_size(i) says") from exc

    def contradictions(self) -> None:
        for contradiction in CONTRADICTIONS:
            name, change, named = contradiction.model, contradiction.change, contradiction.named
            try:
                self.own.load_model(name)
            except ModelLoadError as exc:
                self.died(f"while your backend loaded a config with {change}")
                said = exc.reason.splitlines()[0] if exc.reason.strip() else ""  # Triton repeats it on later lines
                if named not in said:
                    raise ExerciseError(f"a config with {change} failed to load, but its message does not name "
                                        f"{named}: {said!r}. Say in one line which tensor (or setting) contradicts "
                                        "the program, and how to fix it") from exc
                continue
            self.died(f"after a config with {change} loaded")
            raise ExerciseError(f"a config with {change} loaded, but the program says otherwise: bind() must check "
                                "the method's input and output (type, the sizes after the batch) against the config, "
                                "and max_batch_size against the input's first size (the exported batch bound)")
