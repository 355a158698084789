"""Shared test configuration."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _collector_left_on() -> Iterator[None]:
    """No test may leave Python's cyclic collector off (portable_ckpt._gc pauses it inside calls
    only): a leaked pause would change every later test in the same worker process."""
    was = gc.isenabled()
    yield
    if was and not gc.isenabled():
        gc.enable()
        pytest.fail("the cyclic garbage collector was left disabled by this test")
