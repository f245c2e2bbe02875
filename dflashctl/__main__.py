from dflashctl.cli import main

raise SystemExit(main())
