"""TensorBoard event files in the real format, written with TensorBoard's own writer (tests only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util


def scalar_event(step: int, tag: str, value: float, as_tensor: bool = False) -> event_pb2.Event:
    if as_tensor:  # how TF2 / flax metric writers store scalars
        summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(value)))
        summary_value.metadata.plugin_data.plugin_name = "scalars"
    else:  # how tensorboardX and older writers store them
        summary_value = summary_pb2.Summary.Value(tag=tag, simple_value=value)
    return event_pb2.Event(step=step, wall_time=1700000000.0 + step, summary=summary_pb2.Summary(value=[summary_value]))


def write(folder: Path, events: list[event_pb2.Event], suffix: str = "") -> Path:
    """One event file in `folder` holding `events`; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(folder), filename_suffix=suffix)
    for event in events:
        writer.add_event(event)
    writer.close()
    return Path(writer._file_name)  # the writer names its file itself (time, host, suffix)
