"""The local token preflight through the real huggingface_hub client, against tests/hubstub.py."""

import pytest

from bootstrap.errors import UserError
from bootstrap.jobs import schema
from bootstrap.results import hub
from tests.hubstub import Token, serve

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def stub(monkeypatch):
    state, server = serve()
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", state.url)
    state.tokens.update(good=Token(), ungated=Token(gated_access=False), reader=Token(role="read"))
    yield state
    server.shutdown()


@pytest.mark.parametrize("version", schema.supported())
def test_base_model_comes_from_maxtext(version):
    assert schema.load(version).hf_id("llama3.1-8b-Instruct") == MODEL


def test_good_token_reads_the_model_and_writes_the_target(stub):
    assert hub.preflight("good", MODEL, "tester/new-model") == [
        "HF_TOKEN: valid, user tester",
        f"HF_TOKEN: can read {MODEL}",
        "HF_TOKEN: can write tester/new-model",
    ]


def test_bad_token(stub):
    with pytest.raises(UserError, match=r"HF_TOKEN: the Hub rejects this token \(HTTP 401\)"):
        hub.preflight("wrong", MODEL)


def test_gated_model_without_access(stub):
    with pytest.raises(
        UserError, match=f"HF_TOKEN: no access to the gated {MODEL}; request it at https://huggingface.co/{MODEL}"
    ):
        hub.preflight("ungated", MODEL)


def test_read_only_token_cannot_publish(stub):
    assert hub.preflight("reader", MODEL) == ["HF_TOKEN: valid, user tester", f"HF_TOKEN: can read {MODEL}"]
    with pytest.raises(UserError, match="results.hub_repo: this token is read-only"):
        hub.preflight("reader", MODEL, "tester/new-model")
    stub.repos["tester/existing"] = {}
    with pytest.raises(UserError, match=r"cannot write to tester/existing \(HTTP 403\)"):
        hub.preflight("reader", MODEL, "tester/existing")


def test_unreachable_hub_is_a_clear_error(monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(UserError, match=f"HF_TOKEN: could not reach the Hub at http://127.0.0.1:{port}"):
        hub.preflight("good", MODEL)
