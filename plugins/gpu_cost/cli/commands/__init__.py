"""Subcommands of ``gpu-cost``: each module here defines ``register(subparsers)``.

Modules are discovered, so a new command is a new file.
"""
