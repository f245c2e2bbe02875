"""The probe report's own version (its fields are the contract with `status`): one module, so the Proxmox host's
kernel-log side (agent/hostpair.py) stamps its reply without carrying the whole probe. Defined beside the reply's
framing (agent/lib/frame.py), where report.py reads it too."""

from dflashctl.agent.lib.frame import PROBE_VERSION

__all__ = ["PROBE_VERSION"]
