"""`python -m autofit.reference`: rewrite docs/knobs.md and docs/export.md from the registries."""

from autofit.reference import main

raise SystemExit(main())
