"""The ground floor every layer may use; it imports nothing else of CrossView.

- :mod:`crossview.core.errors`: :class:`~crossview.core.errors.CrossViewError` and its subclasses.
"""
