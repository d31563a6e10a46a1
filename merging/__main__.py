"""`python -m merging …`: an alias of the `ram-studio` command (an entry point: nothing imports it)."""
from ram_studio.cli import run

run()
