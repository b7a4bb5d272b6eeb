"""herder: a job queue and fleet dispatcher for long-running command-line jobs."""

__version__ = "0.1.0"
