"""`python -m vcloud.cli`: the `vcloud` command."""

import sys

from vcloud.cli import main

sys.exit(main())
