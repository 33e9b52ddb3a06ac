"""``python -m mmseg_mita.bench``: :func:`mmseg_mita.bench.cli.main`."""
import sys

from .cli import main

if __name__ == '__main__':
    sys.exit(main())
