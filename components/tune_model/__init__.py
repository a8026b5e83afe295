"""tune_model: a trainpipe component."""
