"""The Cloud Storage copy: the exact gcloud commands and the check of what they report."""

from bootstrap.remote import gcs_upload

URL = "gs://my-results/2026-11-30-12-00-00"
LISTING = f"""      4096  2026-11-30T12:10:00Z  {URL}/config.json
 5000000000  2026-11-30T12:11:00Z  {URL}/model-00001-of-00004.safetensors
      1024  2026-11-30T12:11:30Z  {URL}/sub/tokenizer.json
TOTAL: 3 objects, 5000005120 bytes (4.66GiB)
"""


def test_commands():
    copy, listing = gcs_upload.commands("/dev/shm/llama3.1-8b-Instruct/hf-trained/r1", URL)
    assert copy == ["gcloud", "storage", "rsync", "--recursive", "/dev/shm/llama3.1-8b-Instruct/hf-trained/r1", URL]
    assert listing == ["gcloud", "storage", "ls", "--long", "--recursive", f"{URL}/**"]


def test_listing_sizes():
    assert gcs_upload.listed_sizes(LISTING, URL) == {
        "config.json": 4096,
        "model-00001-of-00004.safetensors": 5000000000,
        "sub/tokenizer.json": 1024,
    }


def test_local_sizes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "config.json").write_bytes(b"x" * 10)
    (tmp_path / "sub" / "tokenizer.json").write_bytes(b"y" * 3)
    assert gcs_upload.local_sizes(str(tmp_path)) == {"config.json": 10, "sub/tokenizer.json": 3}
