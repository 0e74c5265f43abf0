"""The shares of a multi-device run (app/parallel/multidevice.py): contiguous spans of the rows in
proportion to weights, and the weights re-balanced from each device's measured speed. Pure arithmetic."""

from __future__ import annotations

from collections.abc import Sequence

from app.engine.forces import Span

SMOOTHING = 0.5  # weight of the newest speed measurement when shares are re-balanced


def split(n: int, weights: Sequence[float]) -> list[Span]:
    """Contiguous shares of [0, n) in proportion to `weights` (largest remainders; they cover n exactly)."""
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, not {list(weights)}")
    total = float(sum(weights))
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - counts[i], reverse=True)[: n - sum(counts)]:
        counts[i] += 1
    spans, start = [], 0
    for count in counts:
        spans.append(Span(start, count))
        start += count
    return spans


def balanced_weights(
    previous: Sequence[float], shares: Sequence[Span], times_ms: Sequence[float], smoothing: float = SMOOTHING
) -> list[float]:
    """New share weights from each device's measured speed (its bodies per ms of force evaluation),
    blended with the previous weights so that one noisy frame does not swing the split. Unchanged while
    any device has no measurement (an empty share, an untimed step)."""
    if any(t <= 0 or s.count <= 0 for s, t in zip(shares, times_ms, strict=True)):
        return list(previous)
    speeds = [s.count / t for s, t in zip(shares, times_ms, strict=True)]
    total_prev, total_speed = float(sum(previous)), sum(speeds)
    return [
        (1 - smoothing) * p / total_prev + smoothing * v / total_speed
        for p, v in zip(previous, speeds, strict=True)
    ]
