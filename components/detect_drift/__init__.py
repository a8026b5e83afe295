"""detect_drift: a trainpipe component."""
