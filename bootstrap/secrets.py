"""Secrets the jobs need, found on the user's machine and never printed.

The Hugging Face token comes from HF_TOKEN or the token that `hf auth login`
stored; it reaches the VM inside an SFTP stream and the jobs through their
environment, never a command line (see vm.Worker.put_secret).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import Problem, UserError
from .remote import joblog

KNOWN = {
    "HF_TOKEN": "the Hugging Face token (export HF_TOKEN=... or run `hf auth login`)",
    "WANDB_API_KEY": "your W&B API key (export WANDB_API_KEY=...; without it, results.wandb logs offline on the VM)",
}
# An MLflow server's credentials (results.mlflow): fab logs to it from this machine, so these never leave it.
MLFLOW_CREDENTIALS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD")
REDACTED = joblog.REDACTED.decode()
# The variables huggingface_hub finds the token by (its constants and get_token), but for those that make it take
# the token from elsewhere first (login_token_path).
HUB_TOKEN_SETTINGS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HOME", "XDG_CACHE_HOME")
HUB_TOKEN_ELSEWHERE = ("HF_OIDC_RESOURCE", "HUGGINGFACE_CO_STAGING")  # an OIDC exchange in CI, the Hub's staging


def lookup(name: str) -> str | None:
    if name == "HF_TOKEN":
        if value := os.environ.get("HF_TOKEN"):
            return value
        stored = login_token_path()
        if stored and os.path.lexists(stored) and not os.path.isfile(stored):  # huggingface_hub: a hang or a traceback
            raise UserError(
                f"{stored} is not a file: `hf auth login` keeps the Hugging Face token there (or set HF_TOKEN)"
            )
        if (token := _plain_login_token(stored)) is not None:
            return token
        import huggingface_hub  # a third of a second to import: only where it alone can tell the token

        try:
            return huggingface_hub.get_token()
        except OSError as err:
            raise UserError(
                f"the Hugging Face token `hf auth login` stored cannot be read ({err}); set HF_TOKEN"
            ) from None
    return os.environ.get(name, "").strip() or None


def login_token_path() -> str | None:
    """Where `hf auth login` stores the token, found as huggingface_hub's constants find it, without importing
    huggingface_hub (the memo of inputs that passed the checks digests this file: jobs/checked.py); None when
    huggingface_hub takes the token from elsewhere first (an OIDC exchange in CI, the Hub's staging mode)."""
    if any(os.environ.get(name) for name in HUB_TOKEN_ELSEWHERE):
        return None
    cache = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    home = _expanded(os.environ.get("HF_HOME", os.path.join(cache, "huggingface")))
    return _expanded(os.environ.get("HF_TOKEN_PATH", os.path.join(home, "token")))


def _plain_login_token(path: str | None) -> str | None:
    """The token `hf auth login` stored at `path`, as huggingface_hub.get_token() returns it, read without
    importing huggingface_hub; None where only huggingface_hub can tell: another variable names the token, none
    is stored, or it may be an OAuth token that huggingface_hub refreshes (`stored_tokens` beside it names a
    refresh token)."""
    if path is None or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().replace("\r", "").replace("\n", "").strip()
    except (OSError, ValueError):  # none stored (then huggingface_hub looks further), or unreadable
        return None
    stored_tokens = os.path.join(os.path.dirname(path), "stored_tokens")
    try:
        refreshed = os.path.isfile(stored_tokens) and b"refresh_token" in Path(stored_tokens).read_bytes()
    except OSError:
        return None
    return token if token and not refreshed else None


def _expanded(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


NOTIFY_PREFIX = "NOTIFY_"  # a receiver's URL in the VM's secrets folder: NOTIFY_<its variable>


def notify_urls(names: list[str], source: str, required: bool) -> dict[str, str]:
    """results.notify's webhook URLs, each from its environment variable here (a secret, as the token is): the
    name it is stored under on the VM -> the URL. One error naming every variable missing or not a URL."""
    found, problems = {}, []
    for entry in names:
        name = entry.split(":", 1)[0]
        url = os.environ.get(name, "").strip()
        if not url:
            if required:
                problems.append(Problem(source, "results.notify", f"{name} is not set: export {name}=YOUR_WEBHOOK_URL"))
            continue
        if not url.startswith(("https://", "http://")) or any(c.isspace() for c in url):
            problems.append(Problem(source, "results.notify", f"{name} does not hold an http(s) URL"))
            continue
        found[f"{NOTIFY_PREFIX}{name}"] = url
    if problems:
        raise UserError(problems)
    return found


_HANDLED: set[str] = set()  # every secret value this process has read (here): redact hides each of them


def here(notify: list[str]) -> dict[str, str]:
    """Every secret value set on this machine, by name: the token, the W&B key, MLflow's credentials and the
    webhook URLs of results.notify (`notify`: its entries). Each is then hidden by `redact`, wherever this process quotes it."""
    found = {}
    for name in [*KNOWN, *MLFLOW_CREDENTIALS, *(entry.split(":", 1)[0] for entry in notify)]:
        if value := lookup(name):
            found[name] = value
    _HANDLED.update(found.values())
    return found


def describe(name: str) -> str:
    """What a secret is, for a message: the token's description, else a webhook URL's."""
    if name in KNOWN:
        return KNOWN[name].split(" (")[0]
    return (
        f"{name}, a credential of results.mlflow"
        if name in MLFLOW_CREDENTIALS
        else f"{name}, a webhook URL of results.notify"
    )


def redact(text: str) -> str:
    """`text` with the value of every secret set on this machine (and every one this process read) replaced."""
    try:
        known = set(here([]).values())
    except UserError:  # a token that cannot be read: none to redact (this may be the error saying so)
        known = set()
    for value in sorted(_HANDLED | known, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def require(names_by_source: dict[str, list[str]]) -> dict[str, str]:
    """The values of every secret the job files declare; one line for each that is missing, naming every
    file that declares it."""
    values: dict[str, str] = {}
    missing: dict[str, list[str]] = {}
    for source, names in names_by_source.items():
        for name in names:
            if (value := lookup(name)) is None:
                missing.setdefault(name, []).append(source)
            else:
                values[name] = value
    if missing:
        raise UserError([_missing(name, sources) for name, sources in missing.items()])
    return values


def _missing(name: str, sources: list[str]) -> Problem:
    why = f"{name} is required but not set: {KNOWN.get(name, 'unknown secret')}"
    if len(sources) > 1:
        why += f" (also in {', '.join(Path(source).name for source in sources[1:])})"
    return Problem(sources[0], "secrets", why)


def available(names_by_source: dict[str, list[str]]) -> dict[str, str]:
    """The secrets the job files declare that are set here: only to redact them from what is shown."""
    names = {name for names in names_by_source.values() for name in names}
    return {name: value for name in names if (value := lookup(name)) is not None}
