"""``python -m trainer`` (and ``torchrun -m trainer``) runs the ``treerpo`` command line."""

import sys

from .cli import main

sys.exit(main())
