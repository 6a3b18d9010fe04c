"""``python -m p2pcrawl``: the same as the ``p2pcrawl`` command."""

import sys

from p2pcrawl.startup import main

sys.exit(main())
