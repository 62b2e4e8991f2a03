"""`python -m fairbench.cli`: the same command as the `fairbench` console script."""

import sys

from fairbench.cli.main import main

sys.exit(main())
