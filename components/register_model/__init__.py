"""register_model: the MLflow model registry, with aliases and the full lineage on the version."""
