"""The job model: jobs/*.yaml read once, checked, and rendered into one immutable plan."""
