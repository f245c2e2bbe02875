"""Pure judging: records in, records out, no I/O (the probe collects, analysis judges). A map, entry points first.

The log, from one entry point — `logscan.LogScanner` (`feed(bytes)` as the log grows, `report()` a LogReport;
`logscan.scan(bytes)` for a whole file). Its pieces, in the order a byte meets them:
    rawlines      where the next special line starts; how a line is decoded
    anchorfind    literal anchors found fast; grepfind: the same by GNU grep on a big mapped log
    lineprefix    `[rank3]:`, timestamps and logger prefixes taken off each line
    progress      one progress line → ProgressPoint; progresslines: found in bulk, kept in line order
    threadheaders `Exception in thread NAME:` headers paired with their tracebacks
    tracebacks    a traceback assembled line by line (chain, frames, signature hits)
    workers       launcher reports of dead ranks (torchrun's ChildFailedError …), who failed first
    signatures    the known failures (stable ids, remedies): the one table the scanner matches
    logreport     what the scanner hands out
GPUs: gpus (nvidia-smi CSV / NVML → GpuSample), smiq (`nvidia-smi -q`), gpuwindow (samples over the window,
Thresholds, stall shapes), gpuhealth + xids (ECC, remaps, Xids → findings), hostgpus (the whole GPU host).
The run: verdict (process verdict, has it ended), health.judge (everything → Health, the one verdict engine),
stepclock (when progress last moved), watcher.Watcher (report after report: `status` and the sentinel alike),
judging (a host's JudgeSettings → thresholds, pattern, Watcher), cause (the cause said first), records (JSON pieces).
Records shared with the container side: events (events.jsonl), watchspec (what a sentinel is told: notifications,
policy, restarts, and their parsers). Others: zombies (what kill-zombies may end), stacks (py-spy / faulthandler
dumps), trainseries (loss and τ over steps), safe_names (names the container sends back, checked).
"""
