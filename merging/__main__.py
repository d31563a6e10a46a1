"""`python -m merging …`: an alias of the `ram-studio` command (an entry point: nothing imports it)."""
import sys

from ram_studio.cli import main

sys.exit(main())
