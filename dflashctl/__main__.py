from dflashctl.entry import main

raise SystemExit(main())
