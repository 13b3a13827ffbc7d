"""bootstrap/beside.py: work beside a command that the exit waits for, and work it never waits for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bootstrap.paths import REPO


def exit_with(program: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`program` run by a Python that then exits with code 3, while its threads still work; killed after 30 s."""
    code = (
        f"import sys, time\nfrom bootstrap import beside\nmark = {str(tmp_path / 'mark')!r}\n{program}\nsys.exit(3)\n"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)


def test_the_exit_waits_for_work_that_must_finish(tmp_path):
    """The Hub check: cut off at exit inside huggingface_hub, fab crashed (SIGSEGV) instead of its error."""
    done = exit_with("beside.start(lambda: (time.sleep(0.5), open(mark, 'w').write('done')), finish=True)", tmp_path)
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "mark").read_text() == "done"


def test_the_exit_waits_for_imports_begun_beside_and_for_nothing_else(tmp_path):
    """The dial: a VM that answers nothing never holds up a command that failed (the run would time out)."""
    program = (
        "def dial():\n"
        "    with beside.importing():\n"
        "        time.sleep(0.5)\n"
        "        open(mark, 'w').write('imported')\n"
        "    time.sleep(600)\n"
        "beside.start(dial)"
    )
    done = exit_with(program, tmp_path)
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "mark").read_text() == "imported"
