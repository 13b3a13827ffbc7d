"""bootstrap/secrets.py: the token `hf auth login` stored, found without importing huggingface_hub where it can be,
and a token file that cannot be one refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap import secrets
from bootstrap.errors import UserError
from bootstrap.paths import REPO
from tests import fabfork


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    for name in (*secrets.HUB_TOKEN_SETTINGS, *secrets.HUB_TOKEN_ELSEWHERE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "hf").mkdir()
    return tmp_path / "hf"


FOUND = """
import sys
from bootstrap import secrets
print(secrets.login_token_path())
print(secrets.lookup("HF_TOKEN"))
print("imported" if "huggingface_hub" in sys.modules else "not imported")
import huggingface_hub
print(huggingface_hub.get_token())
"""


def found(env: dict[str, str | None]) -> list[str]:
    """In a new process (huggingface_hub's constants are set at import): login_token_path(), lookup's token,
    whether lookup imported huggingface_hub, and huggingface_hub's own get_token(). `env`: set, or unset (None)."""
    environ = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    shown = subprocess.run(
        [sys.executable, "-c", FOUND], cwd=REPO, env=environ, capture_output=True, text=True, check=True
    )
    return shown.stdout.splitlines()


def test_the_token_file_is_read_where_huggingface_hub_reads_it_without_importing_it(hf_home: Path):
    a, b, c = ("hf_" + letter * 34 for letter in "abc")
    (hf_home / "token").write_text(a + "\r\n")
    (hf_home / "other").write_text(f"  {b}\n")
    assert found({}) == [str(hf_home / "token"), a, "not imported", a]
    # HF_TOKEN_PATH with ~ or a variable, expanded as huggingface_hub expands them
    home_relative = "~/" + os.path.relpath(hf_home / "other", Path.home())
    assert found({"HF_TOKEN_PATH": home_relative}) == [os.path.expanduser(home_relative), b, "not imported", b]
    assert found({"TOKENS": str(hf_home), "HF_TOKEN_PATH": "$TOKENS/other"}) == [
        str(hf_home / "other"),
        b,
        "not imported",
        b,
    ]
    xdg = hf_home.parent / "xdg"
    (xdg / "huggingface").mkdir(parents=True)
    (xdg / "huggingface" / "token").write_text(c)
    assert found({"XDG_CACHE_HOME": str(xdg), "HF_HOME": None}) == [
        str(xdg / "huggingface" / "token"),
        c,
        "not imported",
        c,
    ]


def test_huggingface_hub_tells_the_token_where_only_it_can(hf_home: Path):
    """An OAuth token it may refresh, another variable naming the token, none stored: its own answer."""
    (hf_home / "token").write_text("hf_" + "a" * 34)
    (hf_home / "stored_tokens").write_text(
        "[laptop]\nhf_token = hf_" + "a" * 34 + "\nrefresh_token = r\nexpires_at = 4102444800\n"
    )
    assert found({}) == [str(hf_home / "token"), "hf_" + "a" * 34, "imported", "hf_" + "a" * 34]
    (hf_home / "stored_tokens").unlink()
    assert found({"HUGGING_FACE_HUB_TOKEN": "hf_" + "b" * 34})[1:] == ["hf_" + "b" * 34, "imported", "hf_" + "b" * 34]
    (hf_home / "token").unlink()
    assert found({})[1:] == ["None", "imported", "None"]


@pytest.mark.parametrize("setting", secrets.HUB_TOKEN_ELSEWHERE)
def test_no_token_file_is_named_when_huggingface_hub_looks_elsewhere_first(hf_home: Path, monkeypatch, setting):
    monkeypatch.setenv(setting, "1")
    assert secrets.login_token_path() is None


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_token_path_that_is_not_a_file_is_refused_in_one_line(hf_home: Path, kind: str):
    """huggingface_hub would raise IsADirectoryError from inside itself for a folder, and wait forever on a FIFO."""
    (hf_home / "token").mkdir() if kind == "folder" else os.mkfifo(hf_home / "token")
    with pytest.raises(UserError) as err:
        secrets.lookup("HF_TOKEN")
    assert f"{hf_home / 'token'} is not a file" in str(err.value)


def test_fab_says_so_in_one_line(hf_home: Path, tmp_path: Path):
    """Through fab's own error report, which redacts the token it looks up again."""
    (hf_home / "token").mkdir()
    fab = fabfork.FAB
    env = {**os.environ, "TPU_RL_RUNS": str(tmp_path / "runs")}
    shown = fabfork.run([fab, "-r", str(REPO), "plan"], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 2
    assert (
        shown.stderr
        == f"error: {hf_home / 'token'} is not a file: `hf auth login` keeps the Hugging Face token there (or set HF_TOKEN)\n"
    )
