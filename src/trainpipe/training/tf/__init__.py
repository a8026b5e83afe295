"""The TensorFlow backend: the context, the model, the MultiWorkerMirroredStrategy and the built-in training
functions. Imports TensorFlow only in its modules, never here."""
