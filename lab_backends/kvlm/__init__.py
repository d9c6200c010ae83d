"""kvlm: a tiny decoder-only transformer over characters, the model behind issue 48's KV-cache backends.

Trained at set-up on the Zen of Python (nothing downloaded) in well under a minute; saved as one
TorchScript file that ``generate_kv`` (Python backend, ``model_repository/generate_kv``) and the native
``generate_kv_paged``/``generate_kv_contiguous`` load. ``reference.decode`` is the greedy decoder with
no cache that every served token is compared with.

This package's ``__init__`` imports no torch (``lab-backends --help`` imports set-up's steps):
``net``, ``train`` and ``reference`` do, import them where needed.
"""

from .build import ARTIFACT, METRICS, PLACEMENTS, build_kvlm, is_fresh

__all__ = ["ARTIFACT", "METRICS", "PLACEMENTS", "build_kvlm", "is_fresh"]
