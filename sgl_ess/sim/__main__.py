"""`python -m sgl_ess.sim`: see cli.py (flags) and commands.py (subcommands)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
