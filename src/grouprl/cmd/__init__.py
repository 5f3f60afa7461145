"""Subcommands of the ``grouprl`` CLI, one module each (see ``grouprl.cli``)."""
