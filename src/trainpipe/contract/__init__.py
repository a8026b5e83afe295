"""The contract every component follows: errors and exit codes, atomic writes,
artifact references, the lineage record, config loading and the entrypoint.

Stdlib and pydantic only: the KFP compiler and the Airflow scheduler import it.
"""
