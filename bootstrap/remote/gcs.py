"""Cloud Storage for the VM's runner and the gke pipeline's driver: what is in the bucket, and small records.

Standard library only (it runs before any environment exists), through the JSON API: the
VM's (or the pod's Workload Identity) service account token from the metadata server, or with STORAGE_EMULATOR_HOST (the
variable google-cloud-storage reads) an emulator, without credentials. The big objects are
MaxText's own business: it writes and reads its checkpoints in the bucket itself. urllib is
imported where it is used: every fab command starts a tool on the VM, and most never reach the bucket.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator

try:
    from . import faults, retry  # on the laptop: bootstrap.remote
except ImportError:
    import faults  # on the VM and in a pod: beside this script in the tools folder
    import retry

SCHEME = "gs://"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
# How long one request may take. Tests only: the fault campaign sets TPU_RL_GCS_TIMEOUT_SECONDS to a
# second, so that an answer slower than the timeout costs a second, not a minute.
TIMEOUT_SECONDS = float(os.environ.get("TPU_RL_GCS_TIMEOUT_SECONDS", "60"))
QUICK_SECONDS = 30  # how long `quick` calls ride out what may pass: within fab's own command timeout
_patience = [retry.RETRY_SECONDS]  # this process's, for the calls to come
REFRESH_SECONDS = 300  # a token this close to its end is fetched again (a runner lives as long as its job)
_token: tuple[str, float] = ("", 0.0)  # the metadata server's access token and when it ends


def is_gcs(path: str) -> bool:
    return path.startswith(SCHEME)


def split(url: str) -> tuple[str, str]:
    """gs://bucket/some/name -> (bucket, some/name)."""
    bucket, _, name = url.removeprefix(SCHEME).partition("/")
    return bucket, name


def _base() -> str:
    return os.environ.get("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com").rstrip("/")


def _headers() -> dict[str, str]:
    global _token
    if "STORAGE_EMULATOR_HOST" in os.environ:
        return {}
    if time.time() > _token[1] - REFRESH_SECONDS:
        import urllib.request

        server = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")  # google-auth's variable
        asked = urllib.request.Request(f"http://{server}{TOKEN_PATH}", headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(asked, timeout=TIMEOUT_SECONDS) as answer:
            granted = json.load(answer)
        if "access_token" not in granted:
            raise OSError(f"the metadata server gave no access token for the VM's service account: {granted}")
        _token = (granted["access_token"], time.time() + float(granted.get("expires_in", 0)))
    return {"Authorization": f"Bearer {_token[0]}"}


@contextlib.contextmanager
def quick() -> Iterator[None]:
    """Calls within give up after QUICK_SECONDS of what may pass: fab's own reads (status, a copy for
    `fab metrics`) and the preflight's check answer while fab waits, where the runner and the driver
    ride out 15 minutes."""
    _patience.append(QUICK_SECONDS)
    try:
        yield
    finally:
        _patience.pop()


def _call(url: str, data: bytes | None = None, method: str = "GET", parse: Callable = bytes):
    """One request, `parse`d (a listing is JSON); what may pass is tried again for 15 minutes, or
    QUICK_SECONDS within `quick` (retry.py: the gke driver's policy too, and Cloud Storage's advice of
    exponential backoff)."""

    import urllib.request

    def once():
        request = urllib.request.Request(url, data=data, method=method, headers=_headers())
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:
            return parse(answer.read())

    return retry.retrying(once, seconds=_patience[-1])


def names(url: str) -> list[str]:
    """The names of every object below the prefix `url` (gs://bucket/prefix), as gs:// URLs."""
    return sorted(sizes(url))


def sizes(url: str) -> dict[str, int]:
    """Every object below the prefix `url`: its gs:// URL and its size."""
    import urllib.parse

    bucket, prefix = split(url)
    found, page = {}, None
    while True:
        query = {"prefix": prefix, "fields": "items(name,size),nextPageToken", **({"pageToken": page} if page else {})}
        listing = _call(f"{_base()}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}", parse=json.loads)
        found |= {f"{SCHEME}{bucket}/{item['name']}": int(item.get("size", 0)) for item in listing.get("items", [])}
        if not (page := listing.get("nextPageToken")):
            return found


def _pattern(glob: str) -> re.Pattern:
    """A glob whose *, ? and [...] stay within one path segment, as on a file system."""
    parts = re.split(r"(\*|\?|\[[^\]/]+\])", glob)
    wild = {"*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wild.get(p) or (f"(?!/){p}" if p.startswith("[") else re.escape(p)) for p in parts if p))


def matches(glob: str, listing: Callable[[str], list[str]] = names) -> list[str]:
    """What a glob names in the bucket: objects, or "folders" with at least one object below them
    (`listing`: the gs:// names below a prefix, through this module or another client)."""
    literal = re.split(r"[*?\[]", glob, maxsplit=1)[0]
    pattern = _pattern(glob.rstrip("/"))
    found = set()
    for name in listing(literal):
        parts = name.split("/")
        for end in range(3, len(parts) + 1):  # gs:, "", bucket, then the name's segments
            if pattern.fullmatch("/".join(parts[:end])):
                found.add("/".join(parts[:end]))
    return sorted(found)


def read(url: str) -> bytes | None:
    """An object's bytes; None when there is none."""
    import urllib.error
    import urllib.parse

    bucket, name = split(url)
    try:
        return _call(f"{_base()}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


def copy_down(url: str, folder: str) -> int:
    """Make `folder` a copy of the objects below the prefix `url`, by their names below it: an object already
    there at its size is kept (TensorBoard events grow), a file whose object is gone is removed. Returns how
    many objects were copied."""
    prefix, copied, kept = f"{url.rstrip('/')}/", 0, set()
    for name, size in sizes(prefix).items():
        target = local_target(folder, name.removeprefix(prefix))
        if target is None:
            continue
        kept.add(target)
        if os.path.isfile(target) and os.path.getsize(target) == size:
            continue
        data = read(name)
        if data is None:
            continue  # deleted since the listing
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(f"{target}.part", "wb") as f:
            f.write(data)
        os.replace(f"{target}.part", target)
        faults.point("copy-down.copied")
        copied += 1
    for root, _, files in os.walk(folder):
        for file in files:
            if os.path.join(root, file) not in kept:
                os.remove(os.path.join(root, file))
                faults.point("copy-down.removed")
    return copied


def local_target(folder: str, relative: str) -> str | None:
    """Where an object named `relative` below a prefix lands in `folder`: None for a folder's placeholder
    (`name/`), a name that would land outside `folder` (`../x`) or one with control characters."""
    target = os.path.normpath(os.path.join(folder, relative))
    inside = target.startswith(os.path.normpath(folder) + os.sep)
    printable = all(ch.isprintable() for ch in relative)
    return target if relative and not relative.endswith("/") and inside and printable else None


def write(url: str, data: bytes) -> None:
    import urllib.parse

    bucket, name = split(url)
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    _call(f"{_base()}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST")


def probe(url: str) -> str | None:
    """What keeps this machine from working below `url` as MaxText does (it reads the bucket's metadata,
    then writes and reads objects), or None."""
    import urllib.error

    bucket, _ = split(url)
    check = f"{url.rstrip('/')}/tpu-rl/probe"
    try:
        _call(f"{_base()}/storage/v1/b/{bucket}?fields=name")
        write(check, b"tpu-rl")
        if read(check) != b"tpu-rl":
            return f"{check} reads back other bytes"
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code} {err.reason}"
    except OSError as err:
        return str(err)
    return None
