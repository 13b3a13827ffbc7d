"""The publish gate against what the repository holds, as its card's model-index says, through the real
huggingface_hub client against tests/hubstub.py: a card is anyone's to edit, so only a sane number holds back."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
from huggingface_hub import HfApi

from bootstrap.paths import REPO as CLONE
from tests import hubstub
from tests.hubstub import Token, serve

sys.path.insert(0, str(CLONE / "bootstrap" / "remote"))  # as on the VM: the tools folder, its modules side by side
hub_upload = importlib.import_module("hub_upload")
manifest = importlib.import_module("manifest")

REPO = "tester/grpo"
RESULT = {"after": 55.0, "problems": 1319}  # this run: 55.0% on 1,319 problems


@pytest.fixture
def api(monkeypatch):
    state, server = serve()
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", state.url)
    state.tokens["good"] = Token()
    yield state, HfApi(endpoint=state.url, token="good")
    server.shutdown()


def holding(api, value: str, problems: str, url: str = "https://example.com/r0") -> dict | None:
    state, client = api
    state.repos[REPO] = {"README.md": hubstub.model_card("r0", value, problems, url)}
    return hub_upload.held_by(client, REPO)


@pytest.mark.parametrize(("value", "problems"), [("-2", "1319"), (".inf", "1319"), (".nan", "1319"), ("101", "1")])
def test_an_accuracy_no_eval_can_have_states_nothing_and_holds_nothing_back(api, value, problems):
    assert holding(api, value, problems) is None


def test_a_card_huggingface_hub_cannot_read_states_nothing(api):
    assert holding(api, "61.5", "1319", url="") is None  # a source name without its URL: the client refuses it


@pytest.mark.parametrize("problems", ["-2", "0", "true", ".inf"])
def test_a_count_that_is_no_positive_integer_is_unknown_and_this_runs_count_stands_for_it(api, problems):
    there = holding(api, "61.5", problems)
    assert there == {"accuracy": 61.5, "problems": None, "run": "r0"}
    assert "61.5% on 1,319 problems" in hub_upload.not_better(RESULT, there, "r1", REPO)


def test_a_better_model_by_less_than_the_noise_of_both_evals_is_held_and_beyond_it_is_not(api):
    """55.0% against 54.0% on 1,319 problems each is within the noise (+-3.8 points): held; 60% is not."""
    there = holding(api, "54.0", "1319")
    held = hub_upload.not_better(RESULT, there, "r1", REPO)
    assert held is not None and "(+-3.8 points)" in held
    assert hub_upload.not_better({"after": 60.0, "problems": 1319}, there, "r1", REPO) is None


def test_an_upload_the_hub_stored_otherwise_is_not_taken_as_kept(api, tmp_path, monkeypatch):
    """After uploading, the Hub's own hashes are read again: a file it stored otherwise fails the upload, and no
    marker says the model is kept there (the next pass uploads it again)."""
    state, _ = api
    monkeypatch.setenv("HF_TOKEN", "good")
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    (export / "model.safetensors").write_bytes(b"weights" * 100)
    manifest.write(str(export))
    card, marker = tmp_path / "card.md", tmp_path / "marker.json"
    card.write_text("# a model\n")
    upload = [str(export), REPO, "--card", str(card), "--marker", str(marker)]
    state.garble_commits_of.add("model.safetensors")
    assert hub_upload.main(upload) == 1 and not marker.exists()
    state.garble_commits_of.clear()
    assert hub_upload.main(upload) == 0 and json.loads(marker.read_text())["files"] == 4
    assert state.repos[REPO]["model.safetensors"] == b"weights" * 100
