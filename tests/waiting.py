"""Waiting for what a test controls, not for wall time: poll an observable condition under a generous
bound, so that a loaded machine only makes a test slower, never makes it fail."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

BOUND_S = 60.0  # far above any healthy wait; reached only when the condition will never hold


def wait_for(
    condition: Callable[[], object],
    what: str,
    timeout: float = BOUND_S,
    poll: float = 0.05,
    step: Callable[[], None] | None = None,
    context: Callable[[], str] | None = None,
):
    """`condition()`'s first true value; fails naming `what` (and `context()`, e.g. a subprocess's output)
    after `timeout` seconds. `step()` runs between polls instead of sleeping (e.g. draw a frame)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout:g} s waiting for {what}" + (f":\n{context()}" if context else "")
            )
        if step is not None:
            step()
        else:
            time.sleep(poll)
