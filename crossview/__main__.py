"""``python -m crossview ...``: the ``crossview`` command (also ``torchrun ... -m crossview train ...``)."""

import sys

from crossview.cli import main

if __name__ == "__main__":
    sys.exit(main())
