"""``python -m cachebake.cli``: the same command line as the ``cachebake`` script."""

import sys

from cachebake.cli import main

sys.exit(main())
