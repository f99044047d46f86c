"""What the lent H200 recorded, for tests without a GPU: NVML idle and busy (tests/data/gpus/), and
the `stack_python` fixture, an interpreter whose preflight probes answer as the H200's did
(tests/data/service/recorded_python.py). Registered in conftest.py."""

import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
IDLE, BUSY = DATA / "gpus" / "h200-idle.json", DATA / "gpus" / "h200-busy.json"
RECORDED_PYTHON = DATA / "service" / "recorded_python.py"


@pytest.fixture
def stack_python(tmp_path) -> str:
    """An interpreter whose preflight probes answer as the H200's did (recorded_python.py)."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{RECORDED_PYTHON}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)
