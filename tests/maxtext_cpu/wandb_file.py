"""A W&B run file (run-ID.wandb, as W&B writes it offline) as JSON: its run record and its history rows.

    python wandb_file.py RUN_FILE    (in a venv with wandb: its protobuf messages)

wandb 0.31 reads these files in its Go core only, so the framing is read here: LevelDB's log format, as W&B's
datastore documents it (a 7-byte header ":W&B" + magic + version; 32 KiB blocks; records of a 7-byte header:
checksum, length, type FULL 1 / FIRST 2 / MIDDLE 3 / LAST 4; a block's tail under 7 bytes is padding).
"""

import json
import struct
import sys

from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32768, 7


def records(data: bytes):
    assert data[:4] == b":W&B", f"not a W&B run file: {data[:7]!r}"
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + HEADER])
        chunk = data[position + HEADER : position + HEADER + length]
        position += HEADER + length
        if kind in (1, 4):
            yield pending + chunk
            pending = b""
        elif kind in (2, 3):
            pending += chunk


def main(path: str) -> None:
    found = {"runs": [], "history": []}
    with open(path, "rb") as f:
        for raw in records(f.read()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = record.run
                found["runs"].append({"id": run.run_id, "name": run.display_name, "project": run.project})
            elif kind == "history":
                found["history"].append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                )
    print(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1])
