"""The small exception hierarchy of the package."""

from __future__ import annotations


class GpuCostError(Exception):
    """Base class of every error the package raises on purpose."""


class PolicyError(GpuCostError):
    """A policy file is missing, malformed or contradicts itself.

    :param source: file (or other origin) of the policy.
    :param path: dotted path inside the document, e.g. ``rules.zombie.util_max``.
    :param reason: what is wrong there.
    """

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = path
        self.reason = reason
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {reason}")


class ScenarioError(GpuCostError):
    """A simulator scenario file is malformed."""


class TraceError(GpuCostError):
    """A trace file (samples or jobs) is missing columns or holds values that cannot be read."""


class SourceError(GpuCostError):
    """A data source (Prometheus, Slurm, a node) could not be read or answered nonsense."""


class StaleDataError(SourceError):
    """The newest data is too old (or absent) to act on."""


class AuditError(GpuCostError):
    """The audit store is unreachable or refused a write; nothing may act."""


class ActionError(GpuCostError):
    """An action could not be carried out."""


class CapExceededError(GpuCostError):
    """A per-run cap would be exceeded: the acting part of the run is aborted."""
