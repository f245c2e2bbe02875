"""dflashctl: deploy, launch and watch DFlash drafter training inside a Proxmox LXC container."""

__version__ = "0.1.0"
