"""The ground floor every layer may use; it imports no other part of CrossView.

- :mod:`crossview.core.errors`: :class:`~crossview.core.errors.CrossViewError` and its subclasses.
- :mod:`crossview.core.settings`: where caches, runs and user data live (environment variables override).
- :mod:`crossview.core.events`: the plain-dataclass progress events methods and runs yield.
- :mod:`crossview.core.devices`: ``auto | cpu | cuda[:n] | mps`` selection.
- :mod:`crossview.core.io`: atomic file writes, validated JSON readers, checkpoints and the events log.
- :mod:`crossview.core.linalg`: the closed-form CCA solve (the ``cca`` method and CTR topic features).
- :mod:`crossview.core.resources`: where the repository's ``resources/`` and ``models/`` folders are.
"""
