"""``python -m p2pcrawl.archive '<json options>'``: the WARC writer process.

An entry point of its own, so that running it does not execute
:mod:`p2pcrawl.archive.process` a second time under ``__main__`` (the package imports it).
"""

import sys

from p2pcrawl.archive.process import main

sys.exit(main())
