"""Check the Hugging Face token on the user's machine, in seconds, before the VM spends anything.

Uses the real huggingface_hub client (HF_ENDPOINT selects the Hub): the token is
valid, it can read the gated base model, and, when the Hub is a results target,
it can write the repository.
"""

from __future__ import annotations

from huggingface_hub import HfApi, set_client_factory
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
from huggingface_hub.utils import _http

from ..errors import UserError

HUB_TIMEOUT_SECONDS = 30


def _client_with_timeout():
    """huggingface_hub's own client, with a timeout: its default waits forever on a Hub that stops answering."""
    client = _http.default_client_factory()
    client.timeout = HUB_TIMEOUT_SECONDS
    return client


set_client_factory(_client_with_timeout)


def preflight(token: str, model: str | None, target_repo: str = "") -> list[str]:
    """What was checked, one line each; raise UserError on the first thing that would fail later."""
    api = HfApi(token=token)
    try:
        me = api.whoami()
    except HfHubHTTPError as err:
        raise UserError(
            f"HF_TOKEN: the Hub rejects this token ({_status(err)}); make a new one at https://huggingface.co/settings/tokens"
        ) from None
    except Exception as err:  # no network, DNS, refused: the HTTP client's own transport errors
        raise UserError(
            f"HF_TOKEN: could not reach the Hub at {api.endpoint} to check the token ({type(err).__name__})"
        ) from None
    done = [f"HF_TOKEN: valid, user {me['name']}"]
    if model:
        try:
            api.auth_check(model)
        except GatedRepoError:
            raise UserError(
                f"HF_TOKEN: no access to the gated {model}; request it at https://huggingface.co/{model} and wait for approval"
            ) from None
        done.append(f"HF_TOKEN: can read {model}")
    if target_repo:
        role = me.get("auth", {}).get("accessToken", {}).get("role")
        try:
            api.auth_check(target_repo, write=True)
        except RepositoryNotFoundError:
            if role == "read":
                raise UserError(
                    f"results.hub_repo: this token is read-only and cannot create {target_repo}; use a write token"
                ) from None
        except HfHubHTTPError as err:
            raise UserError(f"results.hub_repo: this token cannot write to {target_repo} ({_status(err)})") from None
        done.append(f"HF_TOKEN: can write {target_repo}")
    return done


def _status(err: HfHubHTTPError) -> str:
    response = getattr(err, "response", None)
    return f"HTTP {response.status_code}" if response is not None else type(err).__name__


def fetch_tokenizer(token: str, model: str | None) -> str:
    """The base model's tokenizer.json into this machine's Hugging Face cache, where fab plan counts a task's prompts
    with it; one line saying so, or why not (fab plan then counts characters)."""
    from huggingface_hub import hf_hub_download

    if not model:
        return "tokenizer: no base model to fetch it from"
    try:
        hf_hub_download(model, "tokenizer.json", token=token)
    except (HfHubHTTPError, OSError) as err:
        return f"tokenizer: not fetched ({type(err).__name__}); fab plan counts the task's prompts by characters"
    return f"tokenizer: {model}'s cached here; fab plan counts the task's prompts with it"
