"""What the batching panel's text fields mean: parsed here, with a clear error for anything else."""

from __future__ import annotations

from lab_backends.errors import LoadSettingError


def parse_batch_sizes(text: str) -> list[int]:
    """``"4, 8 16"`` -> ``[4, 8, 16]``; a clear :class:`LoadSettingError` for anything else.

    Sizes above the model's ``max_batch_size`` are left for Triton to refuse: its own message says so.
    """
    sizes = []
    for token in text.replace(",", " ").split():
        try:
            size = int(token)
        except ValueError:
            raise LoadSettingError(
                f"preferred batch sizes must be whole numbers separated by commas, e.g. '4, 8, 16'; "
                f"'{token}' is not one"
            ) from None
        if size < 1:
            raise LoadSettingError(f"a preferred batch size must be at least 1, not {size}")
        sizes.append(size)
    return sorted(set(sizes))
