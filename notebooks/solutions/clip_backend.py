"""Reference solution of notebook 09's exercise: the completed C backend is clip_backend.c, beside this file."""

from pathlib import Path

answer = Path(__file__).with_name("clip_backend.c")
