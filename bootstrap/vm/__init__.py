"""Driving the one VM over SSH: the connection, the narrow VM interface, the job graph, progress."""
