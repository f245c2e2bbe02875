"""The run's own sentinel: a small watcher inside the container, started by the run's supervisor, that judges the
run with the same engine as `status` (analysis/watcher.py), writes <run>/events.jsonl, sends notifications and
applies the failure policy — with nobody's laptop connected.

It travels in the agent archive (remote/agentpack.py) with analysis/, report.py, agent/, model.py and errors.py:
stdlib only, no rule copied. Laptop-side code reads spec.py (to check flags before launch) and events.py (to show
the timeline).
"""
