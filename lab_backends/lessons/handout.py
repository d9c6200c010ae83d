"""The C exercises' files, handed out next to the notebooks, and judged against the skeleton as shipped.

Notebooks 09 and 09b tell the learner to complete ``exercises/clip.c`` and
``exercises/tenant_batching.c`` *in place*, next to the notebook. So the file the learner edits
cannot also be the reference for "not attempted": a checker that compared the answer with the
current text of that path saw an edited file as "the untouched skeleton" and refused every correct
answer. The skeletons as shipped live here, in the package (``skeletons/``), and only here:

* :func:`hand_out` (run by ``lab-backends setup``) copies each one into ``notebooks/exercises/``
  when it is not there yet, and never overwrites a learner's file; it also copies the headers the
  skeletons include into ``notebooks/exercises/include/``, because JupyterLab's file browser
  cannot leave ``notebooks/`` (nor a learner's ``~/notebooks`` in a class) to open
  ``c_backends/include/``. The headers are refreshed whenever they differ: they are read, not edited.
* An exercise's file holds only the functions the learner writes; the checker builds it with the rest
  of its backend from ``c_backends/`` (whose own file of those functions is the reference answer).
  A file that still defines the rest (:attr:`Handout.rest`) is an answer in the old format, the
  whole backend: :func:`read_c_answer` says so and how to get the new skeleton.
* :func:`untouched` is what "not attempted" means for every C checker: the text equals the shipped
  skeleton, whitespace aside. The ``TODO(exercise)`` comments may stay in a finished file.
* A skeleton changes when the project does. :func:`hand_out` writes down what it copied
  (``exercises/.handed-out.json``: a digest of each file's words), so a copy still equal to what was
  handed out is the learner's untouched copy of an *older* skeleton: set-up replaces it with the new
  one (nothing of the learner's is in it), and until then its check says "not attempted", as for the
  current skeleton. A copy that equals neither is the learner's, and is never overwritten.
* :func:`reset` hands a fresh skeleton out again, keeping the learner's file beside it as a
  ``.bak`` (``lab-backends exercises reset NAME``): nothing the learner wrote is lost. It resets the
  copy the learner works on (:func:`notebooks_for`): in a class that is ``~/notebooks``, not the
  project's folder, which a learner can read but not write.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from lab_backends.errors import ExerciseError
from lab_backends.paths import NOTEBOOK_DIR
from lab_backends.server.cbackend import INCLUDE_DIR

SKELETONS_DIR = Path(__file__).resolve().parent / "skeletons"
#: Where the notebooks tell the learner to look, relative to the notebook (its working directory).
EXERCISES_SUBDIR = "exercises"
#: What :func:`hand_out` copied into ``exercises/``: file name -> :func:`words_digest` of its text.
RECORD = ".handed-out.json"


@dataclass(frozen=True)
class Handout:
    """One exercise file: the exercise it belongs to and its file name under ``exercises/``."""

    exercise: str
    filename: str
    #: Functions the rest of the backend defines (built with the learner's file): a learner's file that
    #: defines one is the old whole-backend format of the exercise.
    rest: tuple[str, ...] = ()

    @property
    def shipped(self) -> Path:
        """The skeleton as shipped with the package: never edited, the reference for "not attempted"."""
        return SKELETONS_DIR / self.filename

    def in_notebooks(self, notebooks_dir: Path = NOTEBOOK_DIR) -> Path:
        """Where the learner edits it: ``<notebooks>/exercises/<filename>``."""
        return notebooks_dir / EXERCISES_SUBDIR / self.filename


HANDOUTS = (Handout("clip_backend", "clip.c", rest=("TRITONBACKEND_ModelInstanceExecute", "read_bound")),
            Handout("one_tenant_per_batch", "tenant_batching.c",
                    rest=("request_tenant", "TRITONBACKEND_ModelBatcherInitialize")),
            Handout("tf_gather_scatter", "tf_gather_scatter.c",
                    rest=("TRITONBACKEND_ModelInstanceExecute", "TRITONBACKEND_ModelInitialize")),
            Handout("executorch_binding", "executorch_binding.cc",
                    rest=("TRITONBACKEND_ModelInstanceExecute", "check_and_gather")),
            Handout("paged_kv_blocks", "kv_blocks.py"))
#: Headers handed out beside the skeletons, to read: the shared ones, and lab_tensorflow's own
#: (tf_gather_scatter.c includes lab_tensorflow.h, which includes tf_proto.h).
HEADER_DIRS = (INCLUDE_DIR, INCLUDE_DIR.parent / "frameworks" / "lab_tensorflow",
               INCLUDE_DIR.parent / "frameworks" / "lab_executorch")


def handout(exercise: str) -> Handout:
    for item in HANDOUTS:
        if item.exercise == exercise:
            return item
    raise ExerciseError(f"exercise {exercise!r} hands out no file; the ones that do: "
                        f"{', '.join(h.exercise for h in HANDOUTS)}")


def words_digest(text: str) -> str:
    """A digest of ``text``'s words: re-indenting or re-wrapping a file does not change it."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()


def handed_out(folder: Path) -> dict[str, str]:
    """The record of what was handed out into ``folder`` (an ``exercises/`` folder); {} when there is none."""
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def untouched(source: str, item: Handout, folder: Path | None = None) -> bool:
    """Is ``source`` the skeleton as shipped, whitespace aside (re-indenting it is not an attempt), or the
    skeleton that was handed out into ``folder`` before the project changed it?"""
    if source.split() == item.shipped.read_text().split():
        return True
    return folder is not None and handed_out(folder).get(item.filename) == words_digest(source)


def defines(source: str, function: str) -> bool:
    """Does ``source`` define (or declare) C function ``function`` at the start of a line (a comment
    that names it does not count)?"""
    return re.search(rf"^[A-Za-z_][^\n;]*\b{re.escape(function)}\s*\(", source, re.M) is not None


def old_format(source: str, item: Handout) -> str | None:
    """The first function of the rest of the backend that ``source`` defines, or None."""
    return next((f for f in item.rest if defines(source, f)), None)


def read_c_answer(answer: object, item: Handout, notebook: str, not_attempted: str) -> tuple[Path, str]:
    """The learner's C file for ``item`` and its text; ``NotImplementedError(not_attempted)`` while it is
    the skeleton as shipped. Compared with the package's copy, never with the file being edited in
    place (a finished file may keep the skeleton's comments and TODO marks: it is an attempt)."""
    if answer is None:
        raise NotImplementedError(not_attempted)
    path = Path(answer)
    if not path.is_file():
        raise ExerciseError(f"{path.resolve()} is not a file: pass the path of your {item.filename} (notebook "
                            f"{notebook}'s {EXERCISES_SUBDIR}/{item.filename}; `lab-backends exercises reset "
                            f"{item.exercise}` hands out a fresh one)")
    source = path.read_text()
    if untouched(source, item, path.parent if path.name == item.filename else None):
        raise NotImplementedError(not_attempted)
    whole = old_format(source, item)
    if whole is not None:
        raise ExerciseError(
            f"{path.name} defines {whole}(): it is the whole backend, the exercise's old file format. The file "
            f"now holds only the functions you write; the rest of the backend is built with it. Run "
            f"`lab-backends exercises reset {item.exercise}` in a terminal: it hands out the new skeleton and keeps "
            f"your file as a .bak, from which you can copy your function bodies")
    return path, source


def hand_out(notebooks_dir: Path = NOTEBOOK_DIR) -> list[Path]:
    """Copy the skeletons that are missing or still an untouched older skeleton, and the headers that
    differ; the paths written."""
    folder = notebooks_dir / EXERCISES_SUBDIR
    folder.mkdir(parents=True, exist_ok=True)
    record = handed_out(folder)
    written = []
    for item in HANDOUTS:
        target = item.in_notebooks(notebooks_dir)
        now = words_digest(item.shipped.read_text())
        copy = words_digest(target.read_text()) if target.exists() else None
        if copy is not None and copy not in (now, record.get(item.filename)):
            continue  # the learner's work: never overwritten
        if copy != now:  # missing, or the untouched copy of an older skeleton
            shutil.copyfile(item.shipped, target)
            written.append(target)
        record[item.filename] = now
    if record != handed_out(folder):  # written only when it changed: set-up runs often
        (folder / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    include = folder / "include"
    include.mkdir(exist_ok=True)
    for header in sorted(h for d in HEADER_DIRS for h in d.glob("*.h")):
        target = include / header.name
        if not target.exists() or target.read_bytes() != header.read_bytes():
            target.unlink(missing_ok=True)
            shutil.copyfile(header, target)
            target.chmod(0o444)  # a copy to read: edits belong in c_backends/include/
            written.append(target)
    return written


def notebooks_for(cwd: Path) -> Path:
    """The notebooks folder a command run in ``cwd`` works on: ``cwd`` when it holds ``exercises/`` (a
    terminal opened next to the notebook), else ``cwd/notebooks`` when that does (a class learner's
    terminal opens in their home; the spawner copied the course to ``~/notebooks``, and at the
    project's root this is the project's folder), else the project's."""
    for folder in (cwd, cwd / "notebooks"):
        if (folder / EXERCISES_SUBDIR).is_dir():
            return folder
    return NOTEBOOK_DIR


def reset(exercise: str, notebooks_dir: Path = NOTEBOOK_DIR) -> tuple[Path, Path | None]:
    """A fresh skeleton for ``exercise``; the learner's file moves to ``<file>.<time>.bak`` (or None)."""
    item = handout(exercise)
    target = item.in_notebooks(notebooks_dir)
    kept = None
    if target.exists():
        kept = target.with_name(f"{target.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
        target.rename(kept)
    hand_out(notebooks_dir)
    return target, kept
