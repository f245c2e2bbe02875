"""The probe report's own version (its fields are the contract with `status`): one module, so the Proxmox host's
kernel-log side (agent/hostpair.py) stamps its reply without carrying the whole probe."""

PROBE_VERSION = 1
