"""``evalstop run``: a launcher that owns every process of a training job and delivers its stop.

The service never signals a process. A job whose loop ignores ``should_training_stop`` runs under
the launcher, which runs wherever the job runs (one host or many) and only ever signals its own
descendants. Exit codes and behaviour: :mod:`.supervisor`. Jobs that run elsewhere (Ray Jobs, Slurm)
are watched from outside and stopped through their backend: :mod:`.remote`.
"""

from .link import JobLink
from .remote import RemoteWatcher
from .supervisor import FORWARDED_SIGNALS, Launcher, LaunchResult, child_exit_status, heartbeat_interval
from .watch import log_text

__all__ = ["FORWARDED_SIGNALS", "JobLink", "LaunchResult", "Launcher", "RemoteWatcher", "child_exit_status",
           "heartbeat_interval", "log_text"]
