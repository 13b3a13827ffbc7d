"""The layer in front of the Cloud Storage emulator (tests/gcslayer.py) answers as the service does where
tensorstore's OCDBT relies on it, through the official client and plain requests."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
from google.api_core.exceptions import NotFound, PreconditionFailed
from google.cloud import storage

from tests import gcsemulator


@pytest.fixture
def bucket(gcs_emulator) -> storage.Bucket:
    return gcsemulator.client(gcs_emulator).bucket(gcsemulator.BUCKET)


def fresh(bucket: storage.Bucket, data: bytes = b"v1") -> storage.Blob:
    blob = bucket.blob(f"{uuid.uuid4().hex}/x")
    blob.upload_from_string(data)
    blob.reload()
    return blob


@pytest.mark.parametrize("resumable", [False, True])
def test_a_write_that_must_create_is_refused_over_an_existing_object(bucket, resumable):
    blob = fresh(bucket)
    again = bucket.blob(blob.name, chunk_size=256 * 1024 if resumable else None)
    with pytest.raises(PreconditionFailed):
        again.upload_from_string(b"x" * (600 * 1024), if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        bucket.blob(blob.name).upload_from_string(b"v2", if_generation_match=int(blob.generation) + 1)
    bucket.blob(blob.name).upload_from_string(b"v2", if_generation_match=blob.generation)  # the current one: ok
    assert bucket.blob(blob.name).download_as_bytes() == b"v2"


def test_a_read_carries_the_generation_and_one_that_matches_it_is_not_modified(bucket, gcs_emulator):
    blob = fresh(bucket)
    url = f"{gcs_emulator}/storage/v1/b/{bucket.name}/o/{urllib.parse.quote(blob.name, safe='')}?alt=media"
    with urllib.request.urlopen(url) as answer:
        assert answer.headers["x-goog-generation"] == str(blob.generation) and answer.read() == b"v1"
        assert answer.headers["x-goog-stored-content-length"] == "2"
    with pytest.raises(urllib.error.HTTPError) as unchanged:
        urllib.request.urlopen(f"{url}&ifGenerationNotMatch={blob.generation}")
    assert unchanged.value.code == 304
    with pytest.raises(urllib.error.HTTPError) as gone:
        urllib.request.urlopen(f"{url}&generation={int(blob.generation) - 1}")
    assert gone.value.code == 404
    with pytest.raises(NotFound):  # no object: the service's 404, whatever the conditions
        bucket.blob(f"{blob.name}-none").download_as_bytes(if_generation_not_match=0)


def test_a_listing_keeps_to_its_offsets(bucket, gcs_emulator):
    folder = uuid.uuid4().hex
    for name in ("a", "b", "c", "d"):
        bucket.blob(f"{folder}/{name}").upload_from_string(b"x")
    query = urllib.parse.urlencode({"prefix": f"{folder}/", "startOffset": f"{folder}/b", "endOffset": f"{folder}/d"})
    with urllib.request.urlopen(f"{gcs_emulator}/storage/v1/b/{bucket.name}/o?{query}") as answer:
        assert [item["name"] for item in json.loads(answer.read())["items"]] == [f"{folder}/b", f"{folder}/c"]


def test_faults_come_at_the_chosen_request_below_their_prefix_and_writes_are_journaled(gcs_emulator):
    """The fault campaign's control (tests/campaign.py): the 2nd request below a prefix answers 503, the 3rd
    has its connection dropped after the write was done; other prefixes are left alone; the journal has
    each write that was done, with its generation and MD5."""
    prefix = f"{uuid.uuid4().hex}/"
    plan = {"prefix": prefix, "at": {"2": "503", "3": "drop-after"}}
    urllib.request.urlopen(urllib.request.Request(f"{gcs_emulator}/_faults", data=json.dumps(plan).encode()))
    url = f"{gcs_emulator}/upload/storage/v1/b/{gcsemulator.BUCKET}/o?uploadType=media&name="

    def write(name: str) -> int | str:
        try:
            with urllib.request.urlopen(urllib.request.Request(url + name, data=b"x", method="POST")) as answer:
                return answer.status
        except urllib.error.HTTPError as err:
            return err.code
        except OSError as err:
            return type(err).__name__

    assert [write(f"{prefix}a"), write(f"{prefix}b"), write(f"{prefix}c"), write(f"{uuid.uuid4().hex}/d")] == [
        200, 503, "RemoteDisconnected", 200
    ]  # fmt: skip
    with urllib.request.urlopen(f"{gcs_emulator}/_journal?prefix={prefix}") as answer:
        journal = json.load(answer)
    assert [(e["name"], e.get("op") or e["fault"]) for e in journal] == [
        (f"{prefix}a", "write"), (f"{prefix}b", "503"), (f"{prefix}c", "drop-after"), (f"{prefix}c", "write")
    ]  # fmt: skip
    assert all(e["md5"] and e["generation"] for e in journal if "op" in e)
