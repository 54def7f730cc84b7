"""`python -m scaffold` runs the command line."""

import sys

from scaffold.cli import main

sys.exit(main())
