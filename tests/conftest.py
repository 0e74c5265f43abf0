"""Shared test helpers: the published data sets in ../shared/data, skipped cleanly when absent."""

from pathlib import Path

import pytest

from app.paths import SHARED_DATA


@pytest.fixture
def shared_data() -> Path:
    """The shared data folder (it may be absent; use `shared_file` to skip on a missing file)."""
    return SHARED_DATA


def shared_file(name: str) -> Path:
    """Path of a shared data file; skips the calling test, saying which file, when it is absent."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"shared data file {path} is absent")
    return path
