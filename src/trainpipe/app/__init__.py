"""The application layer: the ``trainpipe`` command (:mod:`.cli`), the local engines of ``trainpipe run``
(:mod:`.runner`) and the scaffolds (:mod:`.scaffold`).

It sits above everything else and may import all of it: the DAGs and pipelines it runs and compiles,
the components it forwards to, the library. Nothing imports it (``make lint``'s import-linter contracts
say so), so the library needs no exemption to stay below the compositions.
"""
