"""``python -m gpuscale``: the same as the ``gpuscale`` command."""

from gpuscale.cli import main

raise SystemExit(main())
