"""Our extensions of the ∞-former, as strategy objects behind the core's seams
(`inftyformer.core.seams`, `docs/ARCHITECTURE.md`): they import the core, never the reverse."""

from . import densities, squeezes  # noqa: F401  (registers them at the core's seams)
