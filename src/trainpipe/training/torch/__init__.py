"""The PyTorch backend: the context a team's function gets, its data loading, models, state and checkpoints,
strategies (DDP, FSDP2), timing and profiling, and the built-in training functions. Imports torch only in its
modules, never here."""
