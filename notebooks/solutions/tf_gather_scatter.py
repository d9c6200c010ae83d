"""Reference solution of notebook 09c's exercise: the completed backend is tf_gather_scatter.c, beside this file."""

from pathlib import Path

answer = Path(__file__).with_name("tf_gather_scatter.c")
