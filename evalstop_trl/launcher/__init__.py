"""``evalstop run``: a launcher that owns a training job's process group and delivers its stop.

The service never signals a process. A job whose loop ignores ``should_training_stop`` runs under
the launcher, which runs wherever the job runs (one host or many) and only ever signals its own child.
"""

from .supervisor import Launcher, LaunchResult, child_exit_status

__all__ = ["LaunchResult", "Launcher", "child_exit_status"]
