"""``python -m rl_train`` runs the ``rl-train`` command."""

from rl_train.cli import main

raise SystemExit(main())
