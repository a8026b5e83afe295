"""optimize_model: CPU variants of a trained model (ONNX, int8, pruned), gated on the metric and measured."""
