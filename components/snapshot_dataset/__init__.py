"""snapshot_dataset: an immutable, content-addressed DVC snapshot pushed to a remote."""
