import sys

from infersight.cli import main

sys.exit(main())
