"""The VM-side scripts import their sibling `manifest` as the VM runs them: from their own folder."""

import sys

from bootstrap.paths import REPO

sys.path.insert(0, str(REPO / "bootstrap" / "remote"))
