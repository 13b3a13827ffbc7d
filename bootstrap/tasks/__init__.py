"""Fabric tasks, grouped by theme; fabfile.py puts them all at the top level."""
