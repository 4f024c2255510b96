"""``make bench``: every benchmark, each printing a table and one JSON line."""

from __future__ import annotations

import importlib
import sys

BENCHES: list[tuple[str, list[str]]] = [
    ("bench.sweep", []),
    ("bench.queries", []),
    # 1,000 GPUs here (about 5 minutes on two cores); the full size is
    # `python -m bench.prometheus --gpus 10000` (see docs/benchmarks.md)
    ("bench.prometheus", ["--gpus", "1000", "--jobs", "4000", "--repeat", "1"]),
    ("bench.replay", []),
    ("bench.replay_hard", []),
    ("bench.replay_stages", []),
    ("bench.verifier_month", []),
    ("bench.parse", []),
    # what a running dag-processor reports for each file (mean and max of 10 parses)
    ("bench.dag_parse", []),
    ("bench.slurm_json", []),
    ("bench.approval_skip", []),
    ("bench.forecast", []),
    # the sample shipped with the docs; the full Helios series and ThetaGPU's months: docs/benchmarks.md
    ("bench.power_frontier", ["--series", "docs/data/helios_vc_demand_sample.csv"]),
    ("bench.soak", []),
]


def main() -> int:
    failed = []
    for module, args in BENCHES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                print(f"\n## {module.split('.')[-1]}: not available in this build", flush=True)
                continue
            raise
        print(f"\n# {module}", flush=True)
        try:
            mod.main(args)
        except Exception as exc:  # report it and go on with the other benches
            print(f"{module} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed.append(module)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
