"""Every name a lesson uses is defined in that lesson, in every branch, not only in those a run reaches.

A branch that runs only when the machine is slow (a claim's ``remeasure``) is skipped by a run on a
quiet machine, so a name it alone uses and the notebook never imports fails only on a learner's busy
day: notebook 10's fallbacks once called ``observability`` without importing it. Ruff's undefined-name
rule (F821) reads each notebook as one module, every branch included. The notebooks are outside
``make test``'s ruff run (their cells are lessons, not library code), so this test asks for that rule
alone; ``LAB_FORCE_REMEASURE=1`` (:func:`lab_backends.notebook.forced_remeasure`) runs the fallbacks.
"""

from __future__ import annotations

import subprocess
import sys

from lab_backends.paths import lesson_notebooks

NOTEBOOKS = lesson_notebooks()


def _undefined_names(*paths: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821",
                           "--output-format", "concise", *paths], capture_output=True, text=True, check=False)


def test_no_lesson_uses_a_name_it_never_defines() -> None:
    done = _undefined_names(*map(str, NOTEBOOKS))
    assert done.returncode == 0, done.stdout


def test_the_rule_finds_a_name_used_only_in_a_fallback(tmp_path) -> None:
    """The check can fail: a notebook whose re-measure lambda uses a module it never imports."""
    source = ("from lab_backends.notebook import check_measured\\n",
              "check_measured(1, 'x', lambda d: d, below=2, remeasure=lambda k: observability.again(k))\\n")
    book = tmp_path / "fallback.ipynb"
    book.write_text('{"cells": [{"cell_type": "code", "execution_count": null, "id": "a1", "metadata": {}, '
                    '"outputs": [], "source": ["%s", "%s"]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
                    % source)
    done = _undefined_names(str(book))
    assert done.returncode == 1 and "Undefined name `observability`" in done.stdout, done.stdout
