"""Shared test configuration. Unit tests start no process; integration tests use real services."""

from __future__ import annotations

import pathlib

import pytest

DATA = pathlib.Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    """The folder of recorded real outputs and upstream test vectors."""
    return DATA
