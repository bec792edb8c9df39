"""`python -m megamoe` runs the benchmark CLI (same as `python -m megamoe.bench`)."""
from .bench import main

if __name__ == "__main__":  # spawned rank processes re-import this module: do not recurse
    main()
