"""The reference training pipeline for KFP, and its config."""

from trainpipe.faces.kfp_loading import defer_kfp_client

# before kfp is imported: its client (about 1 s) loads when it is named, not with every pipeline built or run
defer_kfp_client()
