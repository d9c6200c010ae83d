"""Reference solution of notebook 09b's exercise: the completed strategy is one_tenant_per_batch.c, beside this file."""

from pathlib import Path

answer = Path(__file__).with_name("one_tenant_per_batch.c")
