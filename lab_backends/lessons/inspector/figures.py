"""The inspector's two pictures: the answer (10 class scores) and the request's waterfall.

Separate from the widget so that a notebook can draw the same figures for an :class:`Inspection`
without a panel, and so that both render to PNG bytes for an ``ipywidgets.Image``.

Deferred import: matplotlib (~1 s), only when a figure is drawn.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from lab_backends.measure.plots_trace import waterfall


def answer_chart(scores: np.ndarray, predicted: int, ax: Any, title: str = "") -> Any:
    """Bars of the 10 class scores, the predicted digit highlighted; NaN (not sent) shown as 'n/a'."""
    values = np.nan_to_num(np.asarray(scores, float), nan=0.0)
    colors = ["#1b5e20" if d == predicted else "#90a4ae" for d in range(len(values))]
    ax.bar(range(len(values)), values, color=colors)
    for digit, score in enumerate(scores):
        if np.isnan(score):
            ax.text(digit, 0.01, "n/a", ha="center", va="bottom", fontsize=7, color="#777777", rotation=90)
    ax.set_xticks(range(len(values)))
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("digit")
    ax.set_ylabel("score")
    ax.set_title(title or f"answer: {predicted}")
    return ax


def png(fig: Any, dpi: int = 80) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def answer_png(inspection: Any) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2, 2.8))
    answer_chart(
        inspection.scores,
        inspection.predicted,
        fig.subplots(),
        title=f"{inspection.model} answered {inspection.predicted}",
    )
    fig.tight_layout()
    return png(fig)


def waterfall_png(inspection: Any) -> bytes:
    from matplotlib.figure import Figure

    stages = inspection.stages
    rows = stages["trace_id"].nunique()
    fig = Figure(figsize=(8.5, 0.45 * rows + 1.6))
    waterfall(
        stages,
        ax=fig.subplots(),
        title=f"request {inspection.request_id!r} ({inspection.protocol}), from the trace file",
    )
    fig.tight_layout()
    return png(fig)
