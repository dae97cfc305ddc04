from v100lab.cli import main

raise SystemExit(main())
