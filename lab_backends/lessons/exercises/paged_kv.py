"""The KV-cache lesson's exercise (``paged_kv_blocks``): the paged cache's bookkeeping, ``kv_blocks.py``.

The learner completes ``append`` (a token's place: a new block when the last is full) and ``release``
(every block back to the pool, at a sequence's end and on cancel) of ``BlockTable`` in the file handed
out as ``exercises/kv_blocks.py``, edited in place. Why this piece and why Python: the bookkeeping is
the idea of paged attention (vLLM's block table), a handful of lines whose every mistake has a name;
the attention over cached keys is arithmetic a learner copies. And a Python backend's file is judged
in seconds, where a C++ backend is rebuilt against libtorch's headers first (lab_kvcache: 15-25 s of
g++ here).

The checker judges the file in two steps, and refuses with the first fault, in one line:

1. driven directly (:mod:`.paged_kv_probe`, in a child process with a deadline): off-by-one at a
   block boundary, a block shared between sequences, a block leaked after a finished or cancelled
   sequence, an ``append`` that returns None but changes the table, a slot that is not where the
   block table says;
2. served: the file goes into a copy of ``generate_kv`` (its model.py imports it) with a pool of
   :data:`KV_BLOCKS` blocks of :data:`BLOCK_TOKENS` tokens, on a server of its own; :data:`ASKS`
   (mixed lengths, more than the pool holds at once, so some wait or are preempted) stream
   concurrently with one more cancelled by its client, and every token must be the reference
   decoder's (greedy, no cache: ``lab_backends.kvlm.reference``), every step's BLOCKS what the cached
   tokens need, and the pool whole again afterwards (a probe's FREE_BLOCKS).

No hang: the probe has its deadline, the streams :data:`STREAM_DEADLINE_S`, and every gRPC request the
check's (``exercises.check``: 60 s).

Deferred import: ``lab_backends.kvlm.reference`` imports torch, which only the served half needs; importing
the exercises (every notebook does) stays without it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import shutil
import tempfile
from pathlib import Path

from lab_backends.errors import ExerciseError, ModelLoadError
from lab_backends.kvlm.build import PLACEMENTS
from lab_backends.lessons.exercises.paged_kv_probe import probe_file
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.lessons.handout import handout, read_c_answer
from lab_backends.measure.kv_streams import KvAsk, KvRun, free_blocks_after, stream_kv
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

NAME = "paged_kv_blocks"
NOTEBOOK = "08c_inside_an_llm_backend"
SERVED = "generate_kv"
MODEL = "kv_blocks_exercise"
KV_BLOCKS, BLOCK_TOKENS, STEP_MS = 32, 4, 10
STREAM_DEADLINE_S = 40.0
_ZEN_LINES = ("Beautiful is better than ugly.", "Explicit is better than implicit.", "Simple is better than complex.",
              "Flat is better than nested.", "Readability counts.", "Errors should never pass silently.")
#: Prompts of 3-30 characters and 7-30 tokens: 42 blocks of 4 tokens in all at their longest, against 32.
ASKS = tuple(KvAsk(f"s{i}", line[:chars], tokens) for i, (line, chars, tokens)
             in enumerate(zip(_ZEN_LINES, (3, 4, 5, 9, 13, 30), (9, 12, 20, 7, 30, 25))))
CANCELLED = KvAsk("gone", "Now is better than never.", 100, cancel_after=3)


@exercise(
    NAME,
    notebook=NOTEBOOK,
    task=(
        "Complete append() and release() of BlockTable in exercises/kv_blocks.py (edit the file in place): the "
        "bookkeeping of generate_kv's paged KV cache. The pool is kv_blocks blocks of block_tokens token slots; "
        "self.free lists the free blocks, self.blocks[key] the blocks a sequence holds IN POSITION ORDER (token p "
        "lives in self.blocks[key][p // block_tokens] at offset p % block_tokens), self.length[key] how many "
        "tokens it has cached. append(key): the place of the sequence's next token: take a block off self.free "
        "when its last block is full (or it has none), count the token, return (block, offset); when a block is "
        "needed and none is free, return None and change nothing (model.py lets the sequence wait). "
        "release(key): the sequence ended or was cancelled: every block it held goes back to self.free, and the "
        "sequence is forgotten. The checker drives your class directly (8 blocks of 4 tokens), then serves it in "
        f"a copy of generate_kv ({KV_BLOCKS} blocks of {BLOCK_TOKENS} tokens) and streams {len(ASKS)} concurrent "
        "sequences of mixed lengths and a cancelled one: every token must be the reference decoder's, and every "
        "block must come back."
    ),
    models=(),
)
def _check_paged_kv_blocks(answer: object, server: RunningServer | None) -> str:
    if answer is not None and not isinstance(answer, (str, Path)):
        raise ExerciseError(f"the answer is the path of your file, \"exercises/kv_blocks.py\", not a "
                            f"{type(answer).__name__}: the checker serves the file, as model.py imports it")
    path, source = read_c_answer(answer, handout(NAME), NOTEBOOK,
                                 "append() and release() of exercises/kv_blocks.py are still the skeleton's: "
                                 "write them in the file, save it, and run this cell again")
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise ExerciseError(f"{path.name} line {exc.lineno}: {exc.msg}: fix it and run the cell again") from None
    passed, message = probe_file(path)
    if not passed:
        raise ExerciseError(message)
    return f"{message}; {serve_and_judge(path)}"


@functools.lru_cache(maxsize=None)
def expected(ask: KvAsk, model_file: Path) -> str:
    """The reference decoder's text for one ask (greedy, no cache), computed once per process."""
    from lab_backends.kvlm import reference  # torch (1-6 s): only a check that reached the server needs it

    return reference.generate(reference.load(model_file), ask.prompt, ask.max_tokens)


def write_repository(folder: Path, answer: Path) -> Path:
    """A model repository holding a copy of generate_kv with the learner's kv_blocks.py and a small pool."""
    weights = PLACEMENTS[0]
    if not weights.exists():
        raise ExerciseError(f"{weights} is missing: run `lab-backends setup` (it trains kvlm), then this cell again")
    config = read_config(MODEL_REPOSITORY / SERVED)
    config.name = MODEL
    for key, value in (("kv_blocks", KV_BLOCKS), ("block_tokens", BLOCK_TOKENS), ("step_ms", STEP_MS)):
        config.parameters[key].string_value = str(value)
    version = folder / MODEL / "1"
    version.mkdir(parents=True)
    (folder / MODEL / "config.pbtxt").write_text(config_text(config))
    shutil.copy2(MODEL_REPOSITORY / SERVED / "1" / "model.py", version / "model.py")
    shutil.copy2(weights, version / "kvlm.pt")
    shutil.copyfile(answer, version / "kv_blocks.py")
    return weights


def serve_and_judge(answer: Path) -> str:
    """Serve the learner's file on a server of our own; the verdict of :func:`judge`."""
    with tempfile.TemporaryDirectory(prefix="exercise-kv-blocks-") as tmp:
        weights = write_repository(Path(tmp), answer)
        try:
            own = TritonServer(model_repository=[Path(tmp)], models=[MODEL], target="local",
                               startup_timeout_s=90).start()
        except ModelLoadError as exc:
            raise ExerciseError(f"the server could not load generate_kv with your kv_blocks.py: {exc}") from exc
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the cancelled one on a stream of its own
                cancelled = pool.submit(stream_kv, own, MODEL, [CANCELLED], STREAM_DEADLINE_S)
                run = stream_kv(own, MODEL, ASKS, timeout_s=STREAM_DEADLINE_S)
                gone = cancelled.result()
            free = free_blocks_after(own, MODEL, KV_BLOCKS, deadline_s=15.0)  # a cancel lands asynchronously
        finally:
            own.stop()
    return judge(run, gone, free, {a.name: expected(a, weights) for a in ASKS})


def judge(run: KvRun, gone: KvRun, free: int, wanted: dict[str, str]) -> str:
    """The first fault the streams and the model's records show, as an ExerciseError; else what the run showed."""
    if not gone[CANCELLED.name].tokens:
        raise ExerciseError(f"the sequence to cancel got no token: {(gone.errors or ['no error'])[0][:300]}")
    answered = [e for e in run.errors if not e.startswith("not every request finished")]
    if answered:
        raise ExerciseError(f"the served model answered with an error: {answered[0].splitlines()[0][:300]}")
    unfinished = [g for g in run.generations if not g.complete]
    if unfinished:
        records = run.records()
        last = int(records.sort_values("t_s").free_blocks.iloc[-1]) if len(records) else KV_BLOCKS
        raise ExerciseError(
            f"{len(unfinished)} of {len(ASKS)} sequences got no final flag within {STREAM_DEADLINE_S:g} s (sequence "
            f"{unfinished[0].ask.name}: {len(unfinished[0].tokens)} of {unfinished[0].ask.max_tokens} tokens); the "
            f"last record showed {last} of {KV_BLOCKS} blocks free: the waiting ones never found blocks, so blocks "
            "of ended sequences never came back (a block leaked after a finished or cancelled sequence?)")
    for g in run.generations:
        got, want = g.text, wanted[g.ask.name]
        wrong = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if wrong is not None:
            raise ExerciseError(
                f"a token differs from the reference decoder's: sequence {g.ask.name} ({g.ask.prompt!r}) token "
                f"{wrong} is {got[wrong]!r}, the reference's {want[wrong]!r}: a key or value was written to, or read "
                "from, another place than the block table says")
        for t in g.tokens[:-1]:
            need = -(-(len(g.ask.prompt) + t.step) // BLOCK_TOKENS)
            if t.blocks != need:
                raise ExerciseError(f"after step {t.step} sequence {g.ask.name} held {t.blocks} blocks where its "
                                    f"{len(g.ask.prompt) + t.step} cached tokens need {need}: off-by-one at a block "
                                    "boundary")
    if free != KV_BLOCKS:
        raise ExerciseError(f"a block leaked after finished or cancelled sequences: once every sequence ended the pool "
                            f"had {free} of {KV_BLOCKS} blocks free; release() must give back every block")
    records = run.records()
    return (f"served: {len(ASKS)} concurrent sequences ({sum(a.max_tokens for a in ASKS)} tokens) each equal to the "
            f"reference decoder's, at most {run.max_batch()} stepping at once in {KV_BLOCKS} blocks of "
            f"{BLOCK_TOKENS} (the lowest FREE_BLOCKS {int(records.free_blocks.min())}); after the ends and a "
            f"cancellation all {KV_BLOCKS} blocks were free again")
