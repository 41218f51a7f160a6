"""Sub-command groups of the ``crossview`` command, one module each (see ``crossview.cli``)."""
