from v100lab.cli.main import main

raise SystemExit(main())
