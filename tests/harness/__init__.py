"""The end-to-end test harness: a real sshd on loopback, a `pct` stand-in with namespace containers,
and an `nvidia-smi` stand-in. Usage: tests/harness/README.md."""
