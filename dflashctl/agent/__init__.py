"""Everything that runs inside the container (or on the Proxmox host), and nothing that runs only here.

Each program (`launcher`, `reaper`, `codetree`, `check`, `stacks`, `probe.main`, `hostpair`, `hostcheck`) is a
stdlib-only module reached through one verb of the agent archive (verbs.py; built by remote/agentpack.py, installed
once per version by agentinstall.py, called by remote/agentcall.py), built from `lib/` (the run marker, /proc
readers, the one liveness rule, process-group reaping, atomic writes, the reply frame), so every container program
holds one copy of each rule. Modules here import only the standard library and each other; they are importable on
the laptop too, which is how they are unit-tested and how `codetree` hashes both sides with the same code.
"""
