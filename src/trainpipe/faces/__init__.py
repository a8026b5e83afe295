"""Orchestrator helpers shared by the component faces.

Kept apart from :mod:`trainpipe.contract` so a component's core never pulls in
kfp or airflow. ``kfp_runtime`` is stdlib-only: it runs inside the container.
"""

from trainpipe.faces.kfp_loading import defer_kfp_client

# before kfp is imported: its client (about 1 s) loads when it is named, not with every pipeline built or run
defer_kfp_client()
