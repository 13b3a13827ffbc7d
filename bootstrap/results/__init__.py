"""What a run leaves behind: the local record, metrics, durable copies of the model."""
