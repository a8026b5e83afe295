"""Orchestrator helpers shared by the component faces.

Kept apart from :mod:`trainpipe.contract` so a component's core never pulls in
kfp or airflow. ``kfp_runtime`` is stdlib-only: it runs inside the container.
"""
