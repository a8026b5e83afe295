"""evaluate_model: metrics on the held-out split and a gate decision artifact."""
