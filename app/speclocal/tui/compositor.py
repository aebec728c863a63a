"""A cheaper partial screen update for streaming text.

Textual's compositor, for a partial update, renders every widget whose *clip* overlaps the changed
region, and renders it whole: the screen, the header, the footer and every container are rendered
line by line each time one line of an output pane changes, and all but the changed lines are thrown
away. While the model decodes that is ten frames a second of wasted work taking CPU from the decode
threads. `RowCroppedCompositor` renders only the widgets that show a cell of a changed region (not those
hidden there behind a widget in front), and of them only the rows that region touches (each at the
widget's full width, so the cuts between widgets are those of a full render): the same changed cells, a
fraction of the work. Changed regions are taken one by one, not as Textual's bounding box of them all,
so a stats line on the right and a pane line on the left in one frame do not render every row between.

It subclasses a private Textual class (pinned: Textual 8.2.x); `SPECLOCAL_COMPOSITOR=textual` turns it off
and leaves Textual's own compositor in place.
"""

from __future__ import annotations

import os
from typing import Iterable

from textual._compositor import Compositor
from textual.geometry import Region
from textual.strip import Strip


class RowCroppedCompositor(Compositor):
    _updates: list[Region] | None = None  # the changed regions of the partial update being rendered

    def render_partial_update(self):
        self._updates = [r.intersection(self.size.region) for r in self._dirty_regions]
        try:
            return super().render_partial_update()
        finally:
            self._updates = None

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        if crop is None:
            yield from super()._get_renders(crop)
            return
        _rich_traceback_guard = True  # noqa: F841 (as Textual's: no traceback frames from here)
        updates = self._updates if self._updates is not None else [crop]
        width = self.size.width
        in_front: list[Region] = []  # what the widgets already rendered show (front to back: first wins)
        for widget, (region, clip) in self.visible_widgets.items():
            shown = region.intersection(clip)
            rows = _merge([(u.y, u.bottom) for u in updates if _drawn_in(shown, u, in_front)])
            if rows:
                in_front.append(shown)
            for top, bottom in rows:
                part = shown.intersection(Region(0, top, width, bottom - top))
                x, y, w, h = part
                yield region, clip.intersection(part), widget.render_lines(
                    Region(x - region.x, y - region.y, w, h))


def _drawn_in(shown: Region, update: Region, in_front: list[Region]) -> bool:
    """Whether a widget showing `shown` takes part in `update`: it overlaps the update's rows where the
    update is, as in Textual's update (an empty intersection can still "overlap" there), and widgets in
    front of it do not already paint all of its cells in the update."""
    rows = shown.intersection(Region(0, update.y, shown.right, update.height))
    if not (rows.width and rows.height and rows.overlaps(update)):
        return False
    cells = rows.intersection(update)
    return not (cells.width and cells.height and any(front.contains_region(cells) for front in in_front))


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Row ranges [top, bottom) merged where they overlap or touch."""
    out: list[tuple[int, int]] = []
    for top, bottom in sorted(spans):
        if out and top <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], bottom))
        else:
            out.append((top, bottom))
    return out


SWITCH_ENV = "SPECLOCAL_COMPOSITOR"


def install(screen) -> None:
    """Make `screen` update through `RowCroppedCompositor`; nothing changes when $SPECLOCAL_COMPOSITOR is
    "textual", or if this Textual's compositor is not the one it was written against."""
    if os.environ.get(SWITCH_ENV) == "textual":
        return
    compositor = getattr(screen, "_compositor", None)
    if type(compositor) is Compositor and hasattr(compositor, "visible_widgets") and hasattr(
            compositor, "_dirty_regions"):
        compositor.__class__ = RowCroppedCompositor
