"""The Cloud Storage copy: the exact gcloud commands, and a verification by the MD5 that GCS reports.

A `gcloud` stand-in on PATH keeps the "bucket" in a folder; it can be told to skip
objects that already exist at the same size (as a size-based sync would).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys

import pytest

from bootstrap.remote import gcs_upload, manifest

URL = "gs://my-results/runs/2026-11-30-12-00-00"
FAKE_GCLOUD = r"""#!PYTHON
import base64, hashlib, json, os, shutil, sys
base = "gs://my-results/runs/2026-11-30-12-00-00"  # URL: FAKE_BUCKET holds what lies below it
args = sys.argv[1:]

def folder(url):
    below = url.removesuffix("/**").removeprefix(base).strip("/")
    return os.path.join(os.environ["FAKE_BUCKET"], below)

if args[:2] == ["storage", "rsync"]:
    source, bucket = args[-2], folder(args[-1])
    os.makedirs(bucket, exist_ok=True)
    assert os.environ.get("CLOUDSDK_STORAGE_PARALLEL_COMPOSITE_UPLOAD_ENABLED") == "False"
    for name in os.listdir(source):
        target = os.path.join(bucket, name)
        same_size = os.path.exists(target) and os.path.getsize(target) == os.path.getsize(os.path.join(source, name))
        if not (same_size and os.environ.get("FAKE_SIZE_ONLY")):
            shutil.copy(os.path.join(source, name), target)
elif args[:3] == ["storage", "objects", "list"]:
    bucket, prefix = folder(args[3]), args[3].removeprefix("gs://my-results/").removesuffix("**")
    names = sorted(n for n in os.listdir(bucket) if os.path.isfile(os.path.join(bucket, n))) if os.path.isdir(bucket) else []
    if not names:  # as gcloud says it
        sys.exit("ERROR: (gcloud.storage.objects.list) One or more URLs matched no objects.")
    items = [
        {"name": prefix + n, "size": str(os.path.getsize(os.path.join(bucket, n))),
         "md5Hash": base64.b64encode(hashlib.md5(open(os.path.join(bucket, n), "rb").read()).digest()).decode()}
        for n in names
    ]
    print(json.dumps(items))
else:
    sys.exit("unexpected " + " ".join(args))
"""


@pytest.fixture
def export(tmp_path, monkeypatch):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights of run 2")
    manifest.write(str(folder))
    bin_dir, bucket = tmp_path / "bin", tmp_path / "bucket"
    bin_dir.mkdir(), bucket.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD.replace("PYTHON", sys.executable))
    (bin_dir / "gcloud").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_BUCKET", str(bucket))
    return folder, bucket


def test_commands():
    copy, listing = gcs_upload.commands("/dev/shm/llama3.1-8b-Instruct/hf-trained/r1", URL)
    assert copy == [
        "gcloud", "storage", "rsync", "--recursive", "--checksums-only", "/dev/shm/llama3.1-8b-Instruct/hf-trained/r1", URL
    ]  # fmt: skip
    assert listing == ["gcloud", "storage", "objects", "list", f"{URL}/**", "--raw", "--format=json"]


def test_listing_md5_relative_to_the_prefix():
    listing = json.dumps([{"name": "runs/2026-11-30-12-00-00/sub/config.json", "size": "4", "md5Hash": "abc="}])
    assert gcs_upload.listed_md5(listing, URL) == {"sub/config.json": "abc="}


def test_copy_verified_by_md5_writes_the_marker(export, tmp_path):
    folder, bucket = export
    marker = tmp_path / "COPIED.json"
    assert gcs_upload.main([str(folder), URL, "--marker", str(marker)]) == 0
    assert json.loads(marker.read_text())["files"] == 3  # config, weights, SHA256SUMS
    assert (bucket / "model.safetensors").read_bytes() == b"weights of run 2"


def test_same_size_object_from_another_run_fails_verification(export, tmp_path, monkeypatch, capsys):
    folder, bucket = export
    (bucket / "model.safetensors").write_bytes(b"weights of run 1")  # same size, other contents
    monkeypatch.setenv("FAKE_SIZE_ONLY", "1")
    marker = tmp_path / "COPIED.json"
    assert gcs_upload.main([str(folder), URL, "--marker", str(marker)]) == 1
    assert "Cloud Storage's MD5 differs for model.safetensors" in capsys.readouterr().out
    assert not marker.exists()


def test_a_file_changed_since_export_is_not_copied(export, tmp_path, capsys):
    folder, bucket = export
    (folder / "model.safetensors").write_bytes(b"weights of run X")
    assert gcs_upload.main([str(folder), URL, "--marker", str(tmp_path / "m")]) == 1
    assert "model.safetensors no longer match SHA256SUMS" in capsys.readouterr().out
    assert not list(bucket.iterdir())


def test_local_md5_is_what_gcs_reports(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"hello")
    assert gcs_upload.local_md5(str(path)) == base64.b64encode(hashlib.md5(b"hello").digest()).decode()


def test_a_prefix_holding_another_export_is_never_overwritten(export, tmp_path, capsys):
    folder, bucket = export
    (bucket / "SHA256SUMS").write_text("0" * 64 + "  model.safetensors\n")  # an earlier run's durable copy
    (bucket / "model.safetensors").write_bytes(b"weights of run 1")
    before = {p.name: p.read_bytes() for p in bucket.iterdir()}
    assert gcs_upload.main([str(folder), URL, "--marker", str(tmp_path / "copied.json")]) == 1
    assert "holds another export" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in bucket.iterdir()} == before and not (tmp_path / "copied.json").exists()


def test_a_copy_of_the_same_export_that_stopped_half_way_carries_on(export, tmp_path):
    folder, bucket = export
    (bucket / "config.json").write_bytes((folder / "config.json").read_bytes())  # copied before the stop
    (bucket / ".cache").write_bytes(b"rsync copies hidden files that the manifest leaves out")
    assert gcs_upload.main([str(folder), URL, "--marker", str(tmp_path / "copied.json")]) == 0


def test_by_export_each_export_gets_its_own_prefix_and_an_earlier_one_stays(export, tmp_path):
    """A run exported again (new weights after a lost /dev/shm) is copied beside the first copy, never over it."""
    folder, bucket = export
    first_marker, second_marker = tmp_path / "first.json", tmp_path / "second.json"
    assert gcs_upload.main([str(folder), URL, "--by-export", "--marker", str(first_marker)]) == 0
    first = json.loads(first_marker.read_text())["url"]
    (folder / "model.safetensors").write_bytes(b"weights of run 3")
    manifest.write(str(folder))
    assert gcs_upload.main([str(folder), URL, "--by-export", "--marker", str(second_marker)]) == 0
    second = json.loads(second_marker.read_text())["url"]
    key = hashlib.sha256((folder / "SHA256SUMS").read_bytes()).hexdigest()[:12]
    assert second == f"{URL}/{key}" and first != second
    assert (bucket / first.rsplit("/", 1)[1] / "model.safetensors").read_bytes() == b"weights of run 2"
    assert (bucket / key / "model.safetensors").read_bytes() == b"weights of run 3"
