"""`python -m <package>.preflight` runs the check (command.py)."""

from .command import main

if __name__ == "__main__":
    main()
