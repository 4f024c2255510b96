"""Run commands locally or on another host over SSH — always argument lists, never shell strings.

Slurm commands run on this host or on a login node (SSH connection ``gpu_cost_slurm_ssh``); node
commands run over SSH on each node. Both go through a :class:`Runner`, so sources and actions
never build command lines by string concatenation: a job name full of ``;`` and quotes stays one
argument.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpu_cost.core.errors import SourceError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completed:
    """The result of one command."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def command(self) -> str:
        """Return the command as it would be typed (quoted), for audit rows and logs."""
        return shlex.join(self.argv)


class Runner(Protocol):
    """Something that runs an argument list and returns :class:`Completed`."""

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, stdin: str | None = None) -> Completed: ...


class LocalRunner:
    """Run commands on this host with ``subprocess`` (no shell)."""

    def __init__(self, *, env: dict[str, str] | None = None) -> None:
        self.env = env

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, stdin: str | None = None) -> Completed:
        args = [str(a) for a in argv]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=stdin, env=self.env,
                                  check=False)
        except FileNotFoundError:
            return Completed(tuple(args), 127, "", f"{args[0]}: command not found")
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return Completed(tuple(args), 124, out, f"timed out after {timeout:g}s")
        return Completed(tuple(args), proc.returncode, proc.stdout, proc.stderr)

    def __repr__(self) -> str:
        return "LocalRunner()"


class SSHRunner:
    """Run commands on a remote host through the Airflow SSH provider.

    The argument list is quoted with :func:`shlex.join` for the remote shell, so every argument
    arrives intact. Host-key checking follows the connection (on by default in the provider).

    :param conn_id: Airflow SSH connection id.
    :param host: override the connection's host (one connection, many nodes).
    """

    def __init__(self, conn_id: str, *, host: str | None = None, conn_timeout: float = 10.0,
                 conn_attempts: int = 2) -> None:
        self.conn_id = conn_id
        self.host = host
        self.conn_timeout = conn_timeout
        self.conn_attempts = conn_attempts
        self._client = None

    def _hook(self):  # type: ignore[no-untyped-def]
        from airflow.providers.ssh.hooks.ssh import SSHHook

        # a host that accepts the TCP connection and never speaks SSH must not hold a task for the
        # provider's defaults (30 s banner wait, three attempts): every wait is conn_timeout
        kwargs = {"ssh_conn_id": self.conn_id, "conn_timeout": max(1, int(self.conn_timeout)),
                  "banner_timeout": float(self.conn_timeout), "auth_timeout": max(1, int(self.conn_timeout)),
                  "conn_retry_attempts": self.conn_attempts}
        if self.host:
            kwargs["remote_host"] = self.host
        return SSHHook(**kwargs)

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, stdin: str | None = None) -> Completed:
        args = tuple(str(a) for a in argv)
        command = shlex.join(args)
        try:
            hook = self._hook()
            with hook.get_conn() as client:
                _in, out, err = client.exec_command(command, timeout=timeout)
                if stdin is not None:
                    _in.write(stdin)
                    _in.channel.shutdown_write()
                stdout = out.read().decode(errors="replace")
                stderr = err.read().decode(errors="replace")
                rc = out.channel.recv_exit_status()
        except TimeoutError:
            return Completed(args, 124, "", f"timed out after {timeout:g}s on {self.host or self.conn_id}")
        except Exception as exc:
            logger.warning("ssh %s: %s", self.host or self.conn_id, type(exc).__name__)
            return Completed(args, 255, "", f"ssh to {self.host or self.conn_id} failed: {type(exc).__name__}: {exc}")
        return Completed(args, rc, stdout, stderr)

    def __repr__(self) -> str:
        return f"SSHRunner({self.conn_id!r}, host={self.host!r})"


def require_ok(result: Completed, what: str) -> str:
    """Return stdout, or raise SourceError naming the command and its error."""
    if not result.ok:
        raise SourceError(f"{what}: `{result.command}` exited {result.rc}: {result.stderr.strip()[:300]}")
    return result.stdout
