"""`python -m ram_studio …` runs the CLI."""
import sys

from ram_studio.cli import main

sys.exit(main())
