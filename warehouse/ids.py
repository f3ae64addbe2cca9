"""Content-hash keys. A row id is the hash of what determines the row, so re-running a stage recomputes
the same ids and `ON CONFLICT DO NOTHING` makes the insert a no-op. Stable across processes and machines."""
# pyright: basic

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from typing import Any


def content_id(*parts: Any, length: int = 20) -> str:
    """Hex digest of the canonical JSON of `parts` (dict keys sorted, no whitespace)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:length]


def seed_from_id(row_id: str) -> int:
    """A 31-bit sampling seed derived from a row id, so a re-run samples exactly what it replaces."""
    return int(row_id[:8], 16) & 0x7FFFFFFF


_SPACE = re.compile(r"\s+")
_PUNCT = re.compile(r"[^\w\s]")


def normalise_text(text: str) -> str:
    """Lower case, NFKC, punctuation dropped, whitespace collapsed: the key for deduplication."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return _SPACE.sub(" ", _PUNCT.sub(" ", text)).strip()


def norm_hash(text: str) -> str:
    return content_id("norm", normalise_text(text))
