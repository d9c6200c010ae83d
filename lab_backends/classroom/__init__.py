"""A class on one machine (``make class``): one shared Triton, JupyterHub, one Unix account per learner.

Why a package of its own: the Kubernetes class (deploy/) leaves accounts, isolation and process
supervision to the cluster; on one machine we do them ourselves, and each job is small enough to
read alone:

* :mod:`.settings`   the class's ports, paths and names (one dataclass) and the hub's config file;
* :mod:`.roster`     the roster file and the learners' Unix accounts (``class add-learners``);
* :mod:`.spawner`    each learner's JupyterLab in its own PID namespace, as the learner (key hiding);
* :mod:`.supervisor` starts Triton and the hub, stops everything it started, by PID (``class start|stop``);
* :mod:`.command`    the ``lab-backends class`` sub-commands.
* :mod:`.precompile` the venv byte-compiled ahead, as root (``make class``: learners cannot write into it).

It sits above ``lessons`` and below the entry layer (docs/architecture.md).
"""
