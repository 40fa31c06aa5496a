"""Subcommands of the `aspan` CLI, one module each."""
