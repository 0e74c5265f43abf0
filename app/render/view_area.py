"""The part of the window the bodies are drawn for: the window less what overlays cover (the panel).

The viewer asks each of its `view_covers` callables for the rectangle it covers (logical pixels, x0, y0,
x1, y1, or None while hidden) and centres the scene in the widest horizontal stretch left free, with a
lens shift of the projection (`OrbitCamera.projection_matrix(aspect, shift)`): the camera does not turn,
the picture slides, so orbiting and zooming still turn about the scene's centre where the user sees it.
Fit (F) fits the bodies into that stretch. Frames drawn without overlays (`record`, a live recording,
a screenshot without the panel) use the whole frame.
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_FREE_FRACTION = 0.2  # a cover leaving less than this of the width free is ignored (a panel over all)


Rect = tuple[float, float, float, float]


def free_span(width: float, covers: Iterable[Rect | None]) -> tuple[float, float]:
    """The widest stretch [x0, x1] of [0, width] that no cover's x range overlaps; the whole width when
    nothing covers it or less than MIN_FREE_FRACTION would be left."""
    width = float(width)
    if width <= 0:
        return 0.0, max(width, 0.0)
    spans = sorted((max(0.0, min(c[0], c[2])), min(width, max(c[0], c[2]))) for c in covers if c is not None)
    spans = [(a, b) for a, b in spans if b > a]
    if not spans:
        return 0.0, width
    gaps, edge = [], 0.0
    for a, b in spans:
        if a > edge:
            gaps.append((edge, a))
        edge = max(edge, b)
    if edge < width:
        gaps.append((edge, width))
    best = max(gaps, key=lambda g: g[1] - g[0], default=(0.0, width))
    if best[1] - best[0] < MIN_FREE_FRACTION * width:
        return 0.0, width
    return best


def lens_shift(span: tuple[float, float], width: float) -> float:
    """The NDC x shift that puts the picture's centre at the middle of `span` (of a `width` window)."""
    if width <= 0:
        return 0.0
    return (span[0] + span[1]) / width - 1.0
