"""``PYTHONSTARTUP`` of a class learner's kernels (the spawner sets it): the class's limits explained.

IPython runs this file in the kernel's namespace when the kernel starts, so it binds no name of its
own there; ``limits_notice`` says what it installs and why.
"""

from lab_backends.classroom import limits_notice as _limits_notice

_limits_notice.install()
del _limits_notice
