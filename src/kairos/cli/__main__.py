"""`python -m kairos.cli ...` is the `kairos` command."""

import sys

from kairos.cli.main import main

sys.exit(main())
