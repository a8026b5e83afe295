"""Serving a trained model: the built-in networks, the weights-only loader, and the MLflow pyfunc.

``nets.py``, ``loader.py`` and ``pyfunc_model.py`` import nothing of trainpipe: they are copied
into every registered MLflow model so it loads with plain MLflow. ``package.py`` (trainpipe side)
writes that MLflow model.
"""
