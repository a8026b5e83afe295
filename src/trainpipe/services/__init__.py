"""The MLOps services the components share, layered (pyproject's ``services`` contract): the lineage report,
the promotion and the runs' summary read the registry; the gate, pods, hardware profiles, registry, Slurm and
telemetry use the costs, images, serving and tracking; everything may sign. Nothing heavy at import."""
