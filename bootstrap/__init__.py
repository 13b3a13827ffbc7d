"""Everything that runs on or against the TPU VM, driven by Fabric (see fabfile.py)."""
