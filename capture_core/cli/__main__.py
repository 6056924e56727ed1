"""``python -m capture_core.cli``: the ``ngcapture`` command."""

import sys

from capture_core.cli import main

sys.exit(main())
