"""The reference training pipeline for KFP, and its config."""
