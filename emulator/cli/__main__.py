"""`python -m emulator.cli`: the same as `mpft`."""

import sys

from emulator.cli.main import main

sys.exit(main())
