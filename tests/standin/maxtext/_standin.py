"""Shared by the stand-in jobs: argument parsing, knobs, and TensorBoard event files.

Knobs (set through a job's env in the YAML or --arg JOB.env.NAME=VALUE):
STANDIN_SECONDS: seconds per unit of work; STANDIN_FAIL: exit 1 before finishing;
STANDIN_PRINT_TOKEN: print the token and terminal escapes (what a careless job might do);
STANDIN_LOG_MB: write that many MB of debug lines first (a very long log, as debug.rl makes).

Paths may be gs:// URLs, as MaxText's are: then the files go to Cloud Storage through
google-cloud-storage (STORAGE_EMULATOR_HOST: an emulator), and a checkpoint step is
committed as Orbax commits one there, by a commit_success.txt written last in its folder.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import sys
import time

_CRC_TABLE = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _CRC_TABLE.append(c)


def args() -> dict[str, str]:
    """key=value arguments, as pyconfig takes them; --flags as argparse would."""
    parsed = {}
    for arg in sys.argv[1:]:
        key, _, value = arg.lstrip("-").partition("=")
        parsed[key] = value
    return parsed


def require_token() -> None:
    """The real jobs read the gated model with it; STANDIN_PRINT_TOKEN=1 makes a job print it (a leak test)."""
    if not os.environ.get("HF_TOKEN"):
        log("HF_TOKEN is not set: cannot read the gated model")
        sys.exit(3)
    if os.environ.get("STANDIN_PRINT_TOKEN"):
        log(f"Error: the Hub refused token {os.environ['HF_TOKEN']}, retrying \x1b[2J\x1b]0;pwned\x07")


LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR}


class _AbslFormat(logging.Formatter):
    """absl's line: level letter, date, time, pid, file:line, then the message."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        letter = record.levelname[0]
        return (
            f"{letter}{stamp}.{int(record.created % 1 * 1e6):06d} {os.getpid()} {record.where}] {record.getMessage()}"
        )


_absl = logging.getLogger("absl")
_absl.setLevel(logging.INFO)
_stderr = logging.StreamHandler(sys.stderr)  # absl's own handler sits on the root logger too
_stderr.setFormatter(_AbslFormat())
logging.getLogger().addHandler(_stderr)


def log(message: str, level: str = "I", where: str = "standin.py:1") -> None:
    """absl's format on stderr, through Python's logging as absl logs (tests/fixtures/logs): any other handler on
    the root logger sees each line too, as it sees MaxText's."""
    _absl.log(LEVELS[level], message, extra={"where": where})


def python_log(message: str) -> None:
    """to_maxtext does not go through absl.app.run: Python logging's default format."""
    print(f"INFO:absl:{message}", file=sys.stderr, flush=True)


def bar(label: str, total: int) -> None:
    """A tqdm bar as it lands in a log: frames joined by \r, one \n at the end."""
    frames = [
        f"{label}{done * 100 // total:3d}%| | {done}/{total} [00:00<00:00, 9.99it/s]" for done in range(total + 1)
    ]
    sys.stderr.write("\r".join(frames) + "\n")
    sys.stderr.flush()


def flood() -> None:
    megabytes = int(os.environ.get("STANDIN_LOG_MB", "0"))
    line = "I1130 12:00:00.000000 1 rl.py:1] debug " + "x" * 60 + "\n"
    block = line * (2**20 // len(line))
    for _ in range(megabytes):
        sys.stderr.write(block)
    sys.stderr.flush()


def pause() -> None:
    time.sleep(float(os.environ.get("STANDIN_SECONDS", "0")))


def maybe_fail(where: str) -> None:
    if os.environ.get("STANDIN_FAIL"):
        log(f"Traceback (most recent call last): simulated failure in {where}")
        print("RuntimeError: simulated failure (STANDIN_FAIL)", file=sys.stderr, flush=True)
        sys.exit(1)


def _masked_crc(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = b""
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def event_record(step: int, scalars: dict[str, float]) -> bytes:
    """One TFRecord holding an Event{wall_time, step, summary{value{tag, simple_value}}}."""
    values = b""
    for tag, value in scalars.items():
        tag_bytes = tag.encode()
        body = _field(1, 2, _varint(len(tag_bytes)) + tag_bytes) + _field(2, 5, struct.pack("<f", value))
        values += _field(1, 2, _varint(len(body)) + body)
    event = (
        _field(1, 1, struct.pack("<d", time.time()))
        + _field(2, 0, _varint(step))
        + _field(5, 2, _varint(len(values)) + values)
    )
    header = struct.pack("<Q", len(event))
    return header + struct.pack("<I", _masked_crc(header)) + event + struct.pack("<I", _masked_crc(event))


def file_version_record() -> bytes:
    event = _field(1, 1, struct.pack("<d", time.time())) + _field(
        3, 2, _varint(len(b"brain.Event:2")) + b"brain.Event:2"
    )
    header = struct.pack("<Q", len(event))
    return header + struct.pack("<I", _masked_crc(header)) + event + struct.pack("<I", _masked_crc(event))


# --- Files on a disk or in Cloud Storage -----------------------------------------------------------


def _blob_place(url: str):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    bucket, _, name = url.removeprefix("gs://").partition("/")
    emulated = "STORAGE_EMULATOR_HOST" in os.environ
    client = storage.Client(project="standin", credentials=AnonymousCredentials()) if emulated else storage.Client()
    return client.bucket(bucket), name.rstrip("/")


def write(path: str, data: bytes) -> None:
    if path.startswith("gs://"):
        bucket, name = _blob_place(path)
        bucket.blob(name).upload_from_string(data)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def listdir(path: str) -> list[str]:
    """The names directly below a folder (none when it does not exist)."""
    if path.startswith("gs://"):
        bucket, name = _blob_place(path)
        names = {b.name[len(name) + 1 :].split("/")[0] for b in bucket.client.list_blobs(bucket, prefix=f"{name}/")}
        return sorted(names)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def isdir(path: str) -> bool:
    return bool(listdir(path))


def rmtree(path: str) -> None:
    if path.startswith("gs://"):
        bucket, name = _blob_place(path)
        for blob in list(bucket.client.list_blobs(bucket, prefix=f"{name}/")):
            blob.delete()
        return
    shutil.rmtree(path)


def committed_steps(folder: str) -> list[int]:
    """A checkpoint manager's finished steps: on a disk every step folder (Orbax renames a finished one into
    place), in Cloud Storage those with their commit_success.txt."""
    steps = [int(n) for n in listdir(folder) if n.isdigit()]
    if folder.startswith("gs://"):
        steps = [s for s in steps if "commit_success.txt" in listdir(f"{folder}/{s}")]
    return sorted(steps)


class EventFile:
    """A TensorBoard event file, flushed whole on each flush (a bucket has no append), as tensorboardX's is."""

    def __init__(self, path: str):
        self.path, self.data = path, b""

    def write(self, record: bytes) -> None:
        self.data += record

    def flush(self) -> None:
        write(self.path, self.data)
