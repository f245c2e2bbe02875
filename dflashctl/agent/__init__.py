"""Everything that runs inside the container (or on the Proxmox host), and nothing that runs only here.

Each program (`launcher`, `reaper`, `codetree`, `check`, `stacks`, `probe.main`) is a stdlib-only module that travels
on stdin: `dflashctl/remote/scripts.py` pastes the `dflashctl.agent.*` modules it imports (`lib/`: the run
marker, /proc readers, the one liveness rule, process-group reaping, atomic writes, the reply frame) into
it, so every container program holds one copy of each rule. Modules here import only the standard library
and each other (`from dflashctl.agent.X import ...` at the top level, the line the assembler replaces);
they are importable on the laptop too, which is how they are unit-tested and how `codetree` hashes both
sides with the same code.
"""
