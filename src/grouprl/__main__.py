"""``python -m grouprl ...`` = the ``grouprl`` command (``accelerate launch -m grouprl train -c recipe.yaml``)."""

from grouprl.cli import main

raise SystemExit(main())
