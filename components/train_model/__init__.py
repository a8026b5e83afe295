"""train_model: distributed PyTorch training (DDP over gloo on CPU, NCCL on GPU) launched by torchrun."""
