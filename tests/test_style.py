"""The code style is checked, not hoped for: ruff's lint and format (configured in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    pytest.importorskip("ruff", reason="ruff is in the test extras: pip install -e '.[test]'")
    out = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
