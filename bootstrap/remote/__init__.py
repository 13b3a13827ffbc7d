"""Scripts copied to the VM and run there with its system Python (standard library only)."""
