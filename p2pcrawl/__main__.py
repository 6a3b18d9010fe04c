"""``python -m p2pcrawl``: the same as the ``p2pcrawl`` command."""

import sys

from p2pcrawl.ui import main

sys.exit(main())
