"""Where things are, for every test module however deep it sits: the repository, the test fixtures."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
