"""The one simulator: the cluster, its exporter, the demo's week, replays of traces and of power, tuning."""
