"""The one summary of a set of measurements every report uses: median, min, max and count."""

from __future__ import annotations

import statistics


def spread(xs: list[float]) -> dict | None:
    """{"median", "min", "max", "n"} of `xs`; None when empty."""
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}
