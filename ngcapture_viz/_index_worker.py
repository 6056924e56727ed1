"""Entry point of an index worker process: ``python -m ngcapture_viz._index_worker OUT``."""

import sys
from pathlib import Path

from ngcapture_viz._pool import worker_main

if __name__ == "__main__":
    worker_main(Path(sys.argv[1]))
