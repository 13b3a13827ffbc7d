"""A job's log as fab sees it: secrets redacted, streamed as it grows or its last lines, whoever reads it.

The VM redacts what it holds (the secrets its jobs were given) and anything shaped like a Hugging Face token, so a
log shows `<redacted>` even to a laptop that no longer knows the token. Copied to the VM beside jobrunner.py, whose
job folders it reads; standard library only:

    follow JOB_DIR [--tail]       stream the job's log until the job is no longer running
    tail JOB_DIR COUNT [FILE]     the last lines of the job's log (or FILE of its folder)
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator

try:
    from . import jobrunner  # on the laptop: bootstrap.remote
except ImportError:
    import jobrunner  # on the VM: beside this script in the tools folder

READ_CHUNK = 64 * 1024
FOLLOW_POLL_SECONDS = 0.05
REDACTED = b"<redacted>"  # what a secret becomes in any output (bootstrap/secrets.py uses it too)
# Zero or more terminal control sequences or control characters (line ends included), between two bytes.
# Each input has one parse (CSI, OSC, another two-byte escape, or one control byte other than ESC), so
# matching stays linear: overlapping alternatives would backtrack exponentially on crafted output.
CONTROL_BYTES = (
    rb"(?:\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\^_]|[\x00-\x08\x0a-\x1a\x1c-\x1f\x7f])*"
)
QUIET_FLUSH_SECONDS = 1  # bytes held back for a secret's rest are shown once the log is quiet this long
# What any Hugging Face access token looks like: one the VM no longer holds (rotated since, or a job's own) is
# redacted too, in a log written before the change.
TOKEN_SHAPE = (rb"hf_", rb"[A-Za-z0-9]", 30, 128)  # prefix, one character, at least, at most


class Redactor:
    """Replaces the secrets the VM holds (what its jobs were given) in a byte stream, so that a log shows
    `<redacted>` even to a laptop that no longer knows the token. A chunk's last bytes wait for the next
    chunk, so that a secret split between two chunks is still found."""

    def __init__(self, secrets_dir: str):
        folder = os.path.expanduser(secrets_dir)
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        values = []
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                values.append(f.read().strip())
        # Control sequences and line ends may sit between a secret's characters (a job that colours or
        # rewrites its output): still the secret, so the pattern lets them through.
        self.patterns = [
            CONTROL_BYTES.join(re.escape(value[i : i + 1]) for i in range(len(value))) for value in values if value
        ]
        prefix, character, fewest, most = TOKEN_SHAPE
        shaped = CONTROL_BYTES.join(re.escape(prefix[i : i + 1]) for i in range(len(prefix)))
        self.patterns.append(shaped + rb"(?:" + CONTROL_BYTES + character + rb"){%d,%d}" % (fewest, most))
        self.patterns = [re.compile(pattern) for pattern in self.patterns]
        # room for a colour code (up to about 20 bytes) between each two characters of the longest secret
        self.keep = 24 * max([len(prefix) + most, *(len(value) for value in values if value)])
        self.pending = b""

    @classmethod
    def of(cls, job_dir: str) -> Redactor:
        """For a job's folder: its spec names the secrets folder (before launch: nothing to redact)."""
        try:
            with open(os.path.join(job_dir, jobrunner.SPEC)) as f:
                return cls(json.load(f).get("secrets_dir", ""))
        except (OSError, ValueError):
            return cls("")

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be shown (all of it once `data` is b"": the end, or a quiet log)."""
        text = self.pending + data
        for pattern in self.patterns:  # a match that reaches the end may go on in the next chunk: it waits whole
            end = len(text)
            text = pattern.sub(lambda m, end=end: m[0] if data and m.end() == end else REDACTED, text)
        cut = max(0, len(text) - self.keep) if data else len(text)
        self.pending = text[cut:]
        return text[:cut]


class LogReader:
    """A job's log read on from where it was, a chunk at a time, secrets redacted: what `follow` and the
    pipeline driver stream. A log replaced by a fresh attempt (launch keeps the old one aside) is read
    from its start; `inode` says which log the bytes came from."""

    def __init__(self, job_dir: str, position: int = 0):
        self.path = os.path.join(job_dir, jobrunner.LOG)
        self.redactor = Redactor.of(job_dir)
        self.position, self.inode, self.last_data = position, None, time.monotonic()
        self.whole_line = position > 0  # begun mid-file: skip to a whole line, or a cut secret would show

    def read(self) -> bytes | None:
        """The next chunk as it may be shown (b"" while the redactor holds it back); None: nothing new."""
        try:
            with open(self.path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                if self.inode is not None and inode != self.inode:
                    self.position, self.redactor = 0, Redactor.of(os.path.dirname(self.path))
                self.inode = inode
                f.seek(self.position)
                data = f.read(READ_CHUNK)
        except FileNotFoundError:
            data = b""
        if not data:
            quiet = time.monotonic() - self.last_data > QUIET_FLUSH_SECONDS
            return self.redactor.feed(b"") if quiet and self.redactor.pending else None
        self.position += len(data)
        self.last_data = time.monotonic()
        if self.whole_line:
            data, self.whole_line = data.partition(b"\n")[2], False
        return self.redactor.feed(data)

    def rest(self) -> Iterator[bytes]:
        """Everything to the end of the log and what the redactor held back: for a job that has ended."""
        while (chunk := self.read()) is not None:
            yield chunk
        yield self.redactor.feed(b"")


def follow(job_dir: str, tail: bool) -> int:
    """Copy the job's log to stdout as it grows, secrets redacted; end once the job is no longer running."""
    log_path = os.path.join(job_dir, jobrunner.LOG)
    out = sys.stdout.buffer
    reader = LogReader(job_dir, max(0, os.path.getsize(log_path) - 8192) if tail and os.path.exists(log_path) else 0)
    while True:
        chunk = reader.read()
        if chunk is not None:
            out.write(chunk)
            out.flush()
            continue
        if jobrunner.job_state(job_dir)["state"] != jobrunner.JobState.RUNNING.value:
            for chunk in reader.rest():  # the log read to its end after the job stopped
                out.write(chunk)
            out.flush()
            return 0
        time.sleep(FOLLOW_POLL_SECONDS)


def tail(job_dir: str, count: int, name: str) -> int:
    """The last `count` lines of a file of the job's folder (its log by default), secrets redacted."""
    try:
        with open(os.path.join(job_dir, name), "rb") as f:
            start = max(0, os.path.getsize(f.name) - 1024 * 1024)
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return 0
    if start:  # begin at a whole line: a secret cut by the seek would not be found
        data = data.partition(b"\n")[2]
    redactor = Redactor.of(job_dir)
    shown = redactor.feed(data) + redactor.feed(b"")
    parts = shown.split(b"\n")
    if parts[-1] == b"":  # the file ends its last line
        parts = parts[:-1] + [b""]
        sys.stdout.buffer.write(b"\n".join(parts[-count - 1 :]))
    else:
        sys.stdout.buffer.write(b"\n".join(parts[-count:]))
    return 0


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("help", [])
    try:
        if command == "follow" and args:
            return follow(os.path.expanduser(args[0]), "--tail" in args[1:])
        if command == "tail" and len(args) >= 2:
            return tail(os.path.expanduser(args[0]), int(args[1]), args[2] if len(args) > 2 else jobrunner.LOG)
    except BrokenPipeError:
        return 0  # the reader went away (fab stopped following)
    except OSError as err:
        return jobrunner.os_error(command, err)
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
