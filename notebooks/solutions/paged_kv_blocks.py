"""Reference solution of the KV-cache lesson's exercise: generate_kv's own bookkeeping file,
model_repository/generate_kv/1/kv_blocks.py (one source: the model serves with it, and the checker serves
an answer in a copy of the same model)."""

from lab_backends.paths import MODEL_REPOSITORY

answer = MODEL_REPOSITORY / "generate_kv" / "1" / "kv_blocks.py"
