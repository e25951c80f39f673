"""Errors meant for people: each carries one line that names the file or key and the problem."""

from __future__ import annotations


class VcloudError(Exception):
    """An error the CLI reports as one line and a non-zero exit, without a traceback."""


class ConfigError(VcloudError):
    """A configuration file or key is missing, unknown or has the wrong type or value."""


class BadInputError(VcloudError):
    """A raw input file or folder cannot be used."""


EXIT_REQUEUE = 3  # exit status after a signal-triggered checkpoint: SLURM should requeue the job


class StopRequested(VcloudError):
    """SIGTERM/SIGUSR1 arrived during training; latest.pt was written at a step boundary."""
