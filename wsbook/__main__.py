"""``python -m wsbook``: see :mod:`wsbook.cli`."""
import sys

from wsbook.cli import main

if __name__ == "__main__":
    sys.exit(main())
