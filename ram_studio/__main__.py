"""`python -m ram_studio …` runs the CLI."""
from ram_studio.cli import run

run()
