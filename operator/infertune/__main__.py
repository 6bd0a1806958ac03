from infertune.cli import main

raise SystemExit(main())
