"""``PYTHONSTARTUP`` of a class learner's kernels (the spawner sets it): the class's limits explained.

IPython runs this file in the kernel's namespace when the kernel starts. It imports nothing of ours
then: importing ``lab_backends`` (tritonclient, gRPC) would lengthen every kernel's start, and a
slow start is what made JupyterLab ask learners to "Select Kernel" in a busy class. The notices are
installed when the first cell runs (``limits_notice.install``, which says what they are), before
that cell's code. The names bound here start with ``_lab``.
"""

import sys as _lab_sys


def _lab_shell():
    """The kernel's IPython shell (IPython is loaded in a kernel); None in a plain ``python`` shell."""
    ipython = _lab_sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _lab_install_limits_notices(*_):
    _lab_shell().events.unregister("pre_run_cell", _lab_install_limits_notices)
    from lab_backends.classroom import limits_notice  # deferred on purpose: see the module docstring

    limits_notice.install()


if _lab_shell() is not None:
    _lab_shell().events.register("pre_run_cell", _lab_install_limits_notices)
