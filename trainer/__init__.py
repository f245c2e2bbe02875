"""dflash trainer: multi-threaded DFlash drafter training that survives torch.compile (docs/trainer.md)."""
