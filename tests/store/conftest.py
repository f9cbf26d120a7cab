"""Fixtures for the slice-store tests (helpers live in storekit.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from storekit import make_drive

from shinglefs.store import SliceStore
from shinglefs.zoned import EmulatedZonedDrive


@pytest.fixture
def drive_factory(tmp_path: Path) -> Iterator[Callable[..., EmulatedZonedDrive]]:
    made: list[EmulatedZonedDrive] = []

    def factory(name: str = "drive", **geometry: Any) -> EmulatedZonedDrive:
        drive = make_drive(tmp_path / name, **geometry)
        made.append(drive)
        return drive

    yield factory


@pytest.fixture
def store(drive_factory: Callable[..., EmulatedZonedDrive]) -> Iterator[SliceStore]:
    s = SliceStore.format(drive_factory())
    yield s
    s.close()
