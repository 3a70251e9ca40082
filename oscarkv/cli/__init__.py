"""The ``oscarkv`` command line (``main.py``); one module per subcommand, flags in ``flags.py``."""
