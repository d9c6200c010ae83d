"""An 8x8 drawing pad (ipycanvas) and a picker of real test digits: the learner's input.

The pad keeps the image as the data set does (uint8, 0..16 per cell), so what the learner draws is
exactly what a model trained on scikit-learn's digits expects. The brush paints a cell 16 and lifts
its four neighbours to 8: strokes then look like the data set's blurry 4x4-block counts rather than
hard pixels, and the models read them as digits. The pure helpers (:func:`cell_at`, :func:`paint`)
carry the logic and are unit-tested; the widget only forwards mouse events to them.

Deferred imports: ipywidgets and ipycanvas (~0.3 s each), only when a :class:`DigitPad` is built; the
pure helpers also serve the headless exercise audit and the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lab_backends.digits.data import MAX_PIXEL, load_split

GRID = 8
#: Screen pixels per cell: big enough to draw with a mouse.
CELL = 24
#: Value given to the four neighbours of a painted cell (the brush's soft edge).
EDGE = MAX_PIXEL // 2


def cell_at(x: float, y: float, cell: int = CELL) -> tuple[int, int] | None:
    """The ``(row, column)`` under canvas point ``(x, y)``, or None outside the grid."""
    row, col = int(y // cell), int(x // cell)
    return (row, col) if 0 <= row < GRID and 0 <= col < GRID else None


def paint(image: np.ndarray, row: int, col: int) -> np.ndarray:
    """Paint one brush stroke point into ``image`` in place (and return it)."""
    image[row, col] = MAX_PIXEL
    for r, c in ((row - 1, col), (row + 1, col), (row, col - 1), (row, col + 1)):
        if 0 <= r < GRID and 0 <= c < GRID:
            image[r, c] = max(int(image[r, c]), EDGE)
    return image


def stroke(points: list[tuple[int, int]]) -> np.ndarray:
    """An image made of brush points ``[(row, col), ...]``, e.g. a fixed drawing for CI."""
    image = np.zeros((GRID, GRID), np.uint8)
    for row, col in points:
        paint(image, row, col)
    return image


#: A "7" drawn with the brush (what the CI notebook "draws"): a bar on top and a diagonal down.
SEVEN = [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (2, 6), (3, 5), (4, 4), (5, 4), (6, 3)]


class DigitPad:
    """The pad widget: a canvas to draw on, Clear, and a picker of held-out test digits."""

    def __init__(self, examples: int = 30) -> None:
        import ipywidgets as w
        from ipycanvas import Canvas

        split = load_split()
        self.examples, self.labels = split.test_images[:examples], split.test_labels[:examples]
        self.image = np.zeros((GRID, GRID), np.uint8)
        self.canvas = Canvas(width=GRID * CELL, height=GRID * CELL,
                             layout=w.Layout(width=f"{GRID * CELL}px", height=f"{GRID * CELL}px"))
        self.canvas.add_class("lab-digit-pad")
        self._drawing = False
        self.canvas.on_mouse_down(self._down)
        self.canvas.on_mouse_move(self._move)
        self.canvas.on_mouse_up(self._up)
        self.canvas.on_mouse_out(self._up)
        self.clear_button = w.Button(description="Clear", icon="eraser")
        self.clear_button.on_click(lambda _b: self.clear())
        options = [("(draw, or pick a test digit)", -1)] + [
            (f"test digit #{i}: a {int(label)}", i) for i, label in enumerate(self.labels)]
        self.picker = w.Dropdown(options=options, value=-1, description="example", layout=w.Layout(width="260px"))
        self.picker.observe(self._picked, names="value")
        self.widget = w.VBox([self.canvas, w.HBox([self.clear_button]), self.picker])
        self.redraw()

    def _down(self, x: float, y: float) -> None:
        self._drawing = True
        self._move(x, y)

    def _move(self, x: float, y: float) -> None:
        cell = cell_at(x, y)
        if self._drawing and cell is not None:
            paint(self.image, *cell)
            self.redraw()

    def _up(self, x: float, y: float) -> None:
        self._drawing = False

    def _picked(self, change: dict[str, Any]) -> None:
        if change["new"] is not None and change["new"] >= 0:
            self.set_image(self.examples[change["new"]])

    def set_image(self, image: np.ndarray) -> None:
        """Show ``image`` (uint8 8x8, 0..16) on the pad, e.g. a test digit or a scripted drawing."""
        image = np.asarray(image)
        if image.shape != (GRID, GRID):
            raise ValueError(f"the pad holds an 8x8 image, not {image.shape}")
        self.image = np.clip(image, 0, MAX_PIXEL).astype(np.uint8)
        self.redraw()

    def clear(self) -> None:
        self.image = np.zeros((GRID, GRID), np.uint8)
        self.picker.value = -1
        self.redraw()

    def redraw(self) -> None:
        from ipycanvas import hold_canvas

        with hold_canvas():
            self.canvas.fill_style = "white"
            self.canvas.fill_rect(0, 0, GRID * CELL, GRID * CELL)
            for (row, col), value in np.ndenumerate(self.image):
                if value:
                    shade = int(255 - 255 * int(value) / MAX_PIXEL)
                    self.canvas.fill_style = f"rgb({shade},{shade},{shade})"
                    self.canvas.fill_rect(col * CELL, row * CELL, CELL, CELL)
            self.canvas.stroke_style = "#dddddd"
            for i in range(GRID + 1):
                self.canvas.stroke_line(i * CELL, 0, i * CELL, GRID * CELL)
                self.canvas.stroke_line(0, i * CELL, GRID * CELL, i * CELL)
