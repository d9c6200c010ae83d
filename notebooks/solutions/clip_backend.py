"""Reference solution of notebook 09's exercise: the backend's own file c_backends/clip/clip.c (one source:
set-up builds it as backend "clip" with c_backends/include/clip_backend.h, as the checker builds an answer)."""

from lab_backends.server.cbackend import C_BACKENDS_DIR

answer = C_BACKENDS_DIR / "clip" / "clip.c"
