"""``python -m dynamic_treerpo.trainer`` (and ``torchrun -m dynamic_treerpo.trainer``) runs the
``treerpo`` command line."""

import sys

from .cli import main

sys.exit(main())
