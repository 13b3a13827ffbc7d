"""The Compute Engine API's two reads (vm/compute.py, vm/hostkeys.py) against its stand-in (tests/computestub.py): what
each answer means, what is asked again, and each failure in one line that says what to do: a UserError is the user's
to fix, a VmUnavailable passes (fab train --watch tries again)."""

from __future__ import annotations

import google.auth
import google.oauth2.credentials
import pytest

from bootstrap.errors import UserError, VmUnavailable
from bootstrap.vm import compute, hostkeys
from tests import computestub
from tests.stack import closed_port

PROJECT, ZONE, NAME = "my-project", "us-east5-b", "tpu-vm"


@pytest.fixture
def api(monkeypatch):
    state, server = computestub.serve()
    monkeypatch.setenv(compute.COMPUTE_API_ENV, state.url)
    monkeypatch.setattr(compute, "BACKOFF_SECONDS", 0)  # asked again at once
    yield state
    server.shutdown()


def a_host_key() -> str:
    """An ed25519 public key, base64, as a VM's guest agent publishes it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key()
    line = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return line.split()[1]


def test_an_instance_reads_as_its_id_and_status_and_a_deleted_one_as_none(api):
    api.instances[NAME] = {"id": "1001", "status": "TERMINATED"}
    assert compute.instance(PROJECT, ZONE, NAME) == compute.Instance("1001", "TERMINATED")
    assert compute.gone({"project": PROJECT, "zone": ZONE, "instance_name": NAME, "instance_id": "1001"}).exists
    del api.instances[NAME]
    assert compute.instance(PROJECT, ZONE, NAME) is None


def test_only_the_published_keys_of_the_pinned_type_that_are_keys_are_taken(api):
    key = a_host_key()
    api.host_keys[NAME] = [("ssh-ed25519", key + "\n"), ("ssh-rsa", key), ("ssh-ed25519", "not base64!")]
    assert hostkeys.published_keys(PROJECT, ZONE, NAME) == [("ssh-ed25519", key)]
    api.not_yet[NAME] = 1  # the guest agent has not published them yet: 404
    assert hostkeys.published_keys(PROJECT, ZONE, NAME) == []


def test_an_api_that_answers_503_and_429_is_asked_again(api):
    api.instances[NAME] = {"id": "1001", "status": "RUNNING"}
    api.refuse[NAME] = [(503, "backend error"), (429, "slow down"), (503, "backend error")]
    assert compute.instance(PROJECT, ZONE, NAME) == compute.Instance("1001", "RUNNING")
    assert api.refuse[NAME] == []


@pytest.mark.parametrize(
    ("answers", "error", "said"),
    [
        ([(403, "Compute Engine API has not been used in project my-project")], UserError,
         "your Google account may not read the state of tpu-vm (compute.instances.get on my-project): 403 Forbidden: "
         "Compute Engine API has not been used in project my-project"),
        ([(401, "the reason")], UserError, "your Google credentials failed reading the state of tpu-vm (401 "
                                           "Unauthorized: the reason): run `gcloud auth application-default login`"),
        ([(503, "the\n reason")] * 5, VmUnavailable, "the Compute Engine API failed reading the state of tpu-vm: 503 "
                                                     "Service Unavailable: the reason"),  # after 4 more tries
        ([(403, "Quota exceeded: rateLimitExceeded")], VmUnavailable, "the Compute Engine API failed reading the state "
                                                                      "of tpu-vm: 403 Forbidden: Quota exceeded: "
                                                                      "rateLimitExceeded"),
    ],
)  # fmt: skip
def test_each_refusal_is_one_line_that_says_what_to_do(api, answers, error, said):
    api.refuse[NAME] = list(answers)
    with pytest.raises(error) as raised:
        compute.instance(PROJECT, ZONE, NAME)
    assert str(raised.value) == said and type(raised.value) is error
    assert api.refuse[NAME] == []  # every answer was asked for: none more


def test_an_api_out_of_reach_is_a_vm_unavailable_for_now(monkeypatch):
    monkeypatch.setenv(compute.COMPUTE_API_ENV, f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(VmUnavailable, match="the Compute Engine API failed reading .*Connection refused"):
        hostkeys.published_keys(PROJECT, ZONE, NAME)


def test_no_credentials_is_one_line_that_names_the_login(monkeypatch, tmp_path):
    monkeypatch.delenv(compute.COMPUTE_API_ENV, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))  # google.auth.default: refused
    with pytest.raises(UserError) as raised:
        compute.instance(PROJECT, ZONE, NAME)
    said = str(raised.value)
    assert said.startswith("no Google credentials to read the state of tpu-vm (") and "none.json" in said
    assert said.endswith("run `gcloud auth application-default login`")


@pytest.mark.parametrize(
    ("token_server", "error", "said"),
    [
        ("closed", VmUnavailable, "the Compute Engine API failed reading the state of tpu-vm: "),  # the network: later
        ("refusing", UserError, "your Google credentials failed reading the state of tpu-vm (invalid_grant: "),
    ],
)
def test_a_token_that_cannot_be_refreshed_says_whether_to_log_in_again(api, monkeypatch, token_server, error, said):
    """The user's login, refreshed before the read: a token server out of reach passes; one that refuses the login
    (expired or revoked) is the user's to renew. Nothing reaches Google: the refresh fails first."""
    url = f"http://127.0.0.1:{closed_port()}/token" if token_server == "closed" else f"{api.url}/token"
    login = google.oauth2.credentials.Credentials(
        None, "a-refresh-token", token_uri=url, client_id="c", client_secret="s"
    )
    monkeypatch.delenv(compute.COMPUTE_API_ENV)
    monkeypatch.setattr(google.auth, "default", lambda scopes: (login, PROJECT))
    with pytest.raises(error) as raised:
        compute.instance(PROJECT, ZONE, NAME)
    assert str(raised.value).startswith(said) and type(raised.value) is error
    assert "a-refresh-token" not in str(raised.value)
