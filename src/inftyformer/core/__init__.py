"""The ∞-former as published (Martins, Marinho & Martins, ACL 2022, §3): the Gaussian basis, the
ridge-regression fit, continuous attention, the unbounded long-term memory with sticky memories,
and their state. No code here names the library's extensions (the docstrings point to them as
examples); they plug in behind the seams of `seams.py` (`docs/ARCHITECTURE.md`)."""

# the paper's strategies register when the core is imported, before any plugin's (`seams.discover`)
from . import density, squeeze  # noqa: F401
