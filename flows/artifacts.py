"""Keys of the Prefect artifacts the flows publish (iteration tables, the validation curve, the run report)."""

from __future__ import annotations

import re


def artifact_key(*parts: object) -> str:
    """Prefect artifact keys allow only lowercase letters, digits and dashes; any run name maps onto them."""
    text = "-".join(str(p) for p in parts).lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")
