"""The probe's pieces: `main` is the program; it bundles the others and `dflashctl.agent.lib`."""
