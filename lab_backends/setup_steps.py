"""What ``lab-backends setup`` builds, as two lists: the libraries (compiled) and the models (trained or
exported). One line per step, so a new backend or model joins set-up by adding itself here, not by
growing ``cli.py``.

Every step is idempotent and stale-checked by its own module (a second set-up costs about a second).
The compilers run while the models train: set-up's two longest kinds of step need no output of each
other, and g++ on libtorch's headers is one process, training another.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Callable

from lab_backends import charlm, digits, kvlm
from lab_backends.digits import executorch_env
from lab_backends.server import cbackend, executorch_backend, free_quarantine, kv_backend, native_backends

Log = Callable[[str], None]

#: (kind, builder): a builder takes ``force`` and returns {library name: path}.
LIBRARIES: list[tuple[str, Callable[[bool], dict[str, Path]]]] = [
    ("C backend", lambda force: cbackend.build_all(force=force)),
    ("framework backend", lambda force: native_backends.build_all(force=force)),
    ("framework backend", lambda force: executorch_backend.build_all(force=force)),
    ("server preload", lambda force: {"free_quarantine": free_quarantine.build(force=force)}),
    ("KV-cache backend", lambda force: kv_backend.build_all(force=force)),
]

#: A model step takes ``force`` and a log, and returns its one-paragraph summary.
MODELS: list[Callable[[bool, Log], str]] = [
    # The digit models of lessons 04-09c (scikit-learn, torch, ONNX, TensorFlow).
    lambda force, log: digits.build_models(force=force, log=log).summary(),
    # The character model behind generate_static / generate_iterative (notebook 08b): seconds, numpy weights.
    lambda force, log: charlm.build_charlm(force=force, log=log).summary(),
    # kvlm, the transformer behind generate_kv and the generate_kv_* native models (issue 48): ~45 s, TorchScript.
    lambda force, log: kvlm.build_kvlm(force=force, log=log).summary(),
    # digits_et (lesson 09d): ExecuTorch's own venv (numpy 2; 19-50 s and 0.5-0.75 GB, once), then a ~26 s export.
    lambda force, log: executorch_env.build_digits_et(force=force, log=log).summary(),
]


def build_libraries(force: bool = False) -> list[str]:
    """Build what is stale, one line per library."""
    return [f"{kind} {name}: {path}" for kind, build in LIBRARIES for name, path in build(force).items()]


def build_models(force: bool = False, log: Log = print) -> list[str]:
    """Train or export what is stale, one summary per step."""
    return [step(force, log) for step in MODELS]


def build_everything(force: bool = False, log: Log = print) -> list[str]:
    """Libraries and models together (compilers in a thread while the models train); the libraries' lines last."""
    with concurrent.futures.ThreadPoolExecutor(1) as compilers:
        libraries = compilers.submit(build_libraries, force)
        summaries = build_models(force, log)
        return summaries + libraries.result()
