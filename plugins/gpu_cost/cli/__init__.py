"""``gpu-cost``: the command line, the same functions the DAGs call."""
