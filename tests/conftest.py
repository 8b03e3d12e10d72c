"""Shared test configuration: hypothesis profiles.

``dev`` (default) is fast; ``ci`` is thorough and derandomized; ``hunt`` searches new examples.
Select with ``HYPOTHESIS_PROFILE=ci``.
"""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=60, stateful_step_count=50, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# CI draws the same examples every run (a verdict on the code, not on the draw); "hunt" draws
# new ones, many more, to look for bugs: HYPOTHESIS_PROFILE=hunt python -m pytest tests/engine
settings.register_profile(
    "ci", max_examples=300, stateful_step_count=150, deadline=None, print_blob=True,
    derandomize=True, suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "hunt", max_examples=3000, stateful_step_count=200, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def second_model_path() -> Path:
    """The second test model (Gemma 3 270M, another family than the default model), for tests
    marked ``second_model``; `python -m llamapy.models fetch --second` (run by .ci/run) provides
    it."""
    from llamapy.models import second_model_path as path

    return path()
