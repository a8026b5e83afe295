"""profile_training: throughput, step-time breakdown and memory of a training run, as JSON and HTML."""
