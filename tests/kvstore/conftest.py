"""The small chunk layout of kvstore_support as a fixture."""

from __future__ import annotations

import pytest
from kvstore_support import LAYOUT

from xrt.kvstore.chunk import ChunkLayout


@pytest.fixture
def layout() -> ChunkLayout:
    return LAYOUT
