"""Fixtures for the slice-store tests (helpers live in storekit.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import storekit
from storekit import make_drive

from shinglefs.store import SliceStore
from shinglefs.zoned import EmulatedZonedDrive


@pytest.fixture(autouse=True)
def close_reopened_drives() -> Iterator[None]:
    """After each test (and its stores): close the drives storekit reopened."""
    yield
    while storekit.reopened:
        storekit.reopened.pop().close_drive()


@pytest.fixture
def drive_factory(tmp_path: Path) -> Iterator[Callable[..., EmulatedZonedDrive]]:
    made: list[EmulatedZonedDrive] = []

    def factory(name: str = "drive", **geometry: Any) -> EmulatedZonedDrive:
        drive = make_drive(tmp_path / name, **geometry)
        made.append(drive)
        return drive

    yield factory
    for drive in made:  # after the stores built on them (fixtures close in reverse)
        drive.close_drive()


@pytest.fixture
def store(drive_factory: Callable[..., EmulatedZonedDrive]) -> Iterator[SliceStore]:
    s = SliceStore.format(drive_factory())
    yield s
    s.close()
