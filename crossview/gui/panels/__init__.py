"""The main window's panels; each runs alone with ``python -m crossview.gui.panels.<name>``."""
