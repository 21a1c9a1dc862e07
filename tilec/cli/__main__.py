"""`python -m tilec.cli ...`, as the `tilec` command."""

import sys

from .main import main

sys.exit(main())
