"""A stand-in trainer for the lifecycle tests: the real trainer's process contract, none of its ML.

Same command line (`python -m trainer --config FILE --run-dir DIR [extra]`), same `step=` lines,
heartbeat.json and errors/<thread>.json, same exit codes (0 done, 1 worker failure, 2 bad config,
143 after SIGTERM). What it does is chosen by `mode` in the config so a test can script a run.
"""
