"""ruff is the project's linter and formatter: the tree stays clean."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUFF = str(Path(sys.executable).with_name("ruff"))


def test_ruff_check():
    result = subprocess.run([RUFF, "check", str(REPO)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_ruff_format():
    result = subprocess.run([RUFF, "format", "--check", str(REPO)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
