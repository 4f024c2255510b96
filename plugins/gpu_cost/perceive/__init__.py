"""Perceive: Slurm, slurmrestd, Prometheus, the nodes, the GPU map, traces, attribution, snapshots, shards."""
