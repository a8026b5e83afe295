"""trainpipe's components, one folder each (a folder holding a ``metadata.yaml`` is one:
``trainpipe.COMPONENTS``), with the same roles in every folder.

``spec`` (config and result, light), ``core`` (the work, heavy imports inside),
``__main__`` (the container entrypoint), ``kfp_component`` (the KFP v2 face) and
``airflow_task`` (the Airflow 3 face).
"""
