"""A cheaper partial screen update for streaming text.

Textual's compositor, for a partial update, renders every widget whose *clip* overlaps the changed
region, and renders it whole: the screen, the header, the footer and every container are rendered
line by line each time one line of an output pane changes, and all but the changed lines are thrown
away. While the model decodes that is ten frames a second of wasted work taking CPU from the decode
threads. `RowCroppedCompositor` renders only the widgets that overlap the update, and of them only the
rows it touches (each at the widget's full width, so the cuts between widgets are those of a full
render): the same changed cells, a fraction of the work.
"""

from __future__ import annotations

from typing import Iterable

from textual._compositor import Compositor
from textual.geometry import Region
from textual.strip import Strip


class RowCroppedCompositor(Compositor):
    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        if crop is None:
            yield from super()._get_renders(crop)
            return
        _rich_traceback_guard = True  # noqa: F841 (as Textual's: no traceback frames from here)
        rows = Region(0, crop.y, self.size.width, crop.height)
        for widget, (region, clip) in self.visible_widgets.items():
            clip = clip.intersection(rows)
            shown = region.intersection(clip)
            # a widget beside the update owns no cell in it (an empty intersection can still "overlap")
            if shown.width and shown.height and shown.overlaps(crop):
                x, y, width, height = shown
                yield region, clip, widget.render_lines(Region(x - region.x, y - region.y, width, height))


def install(screen) -> bool:
    """Make `screen` update through `RowCroppedCompositor`; False (and nothing changed) if this Textual's
    compositor is not the one it was written against."""
    compositor = getattr(screen, "_compositor", None)
    if type(compositor) is not Compositor or not hasattr(compositor, "visible_widgets"):
        return False
    compositor.__class__ = RowCroppedCompositor
    return True
