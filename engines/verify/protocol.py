"""The parent's reader of the child's result pipe, which treats every byte as hostile.

The child writes `<nonce> <length>\\n<json>` records (see `child.py`); the untrusted code shares the
child's process, can find the nonce and write well-framed records of its own. So nothing here trusts a
record: the header, the length, the JSON, the record's shape and every typed value are checked, decoding
is bounded in size (`max_bytes`) and depth (`child.MAX_DEPTH`), and any problem becomes a `violation`
that fails this one job (`protocol_error`); `feed` never raises.
"""

from __future__ import annotations

import json

from sage.engines.verify.child import decode_value

HEADER_MAX = 64  # "<32 hex nonce> <length>\n" fits well within this


class Records:
    """Incremental, strict parser of one job's result records."""

    def __init__(self, nonce: str, n: int, max_bytes: int):
        self.prefix, self.buf, self.max_bytes = nonce.encode() + b" ", bytearray(), max_bytes
        self.outputs, self.errors = [None] * n, [None] * n
        self.seen, self.load_error, self.ended, self.violation = set(), None, False, None

    def feed(self, data: bytes) -> None:
        if self.violation is not None:
            return
        try:
            self._feed(data)
        except Exception as exc:  # RecursionError and MemoryError included: the job fails, the parent lives
            self.violation = f"undecodable record ({type(exc).__name__})"

    def _feed(self, data: bytes) -> None:
        self.buf += data
        while self.buf and self.violation is None:
            nl = self.buf.find(b"\n", 0, HEADER_MAX)
            if nl < 0:
                if len(self.buf) >= HEADER_MAX:
                    self.violation = "malformed record header"
                return
            head = bytes(self.buf[:nl])
            digits = head[len(self.prefix):]
            if not head.startswith(self.prefix) or not digits.isdigit() or len(digits) > 12:
                self.violation = "bad nonce or header"
                return
            size = int(digits)
            if size > self.max_bytes:
                self.violation = "record too large"
                return
            if len(self.buf) < nl + 1 + size:
                return
            payload = bytes(self.buf[nl + 1:nl + 1 + size])
            del self.buf[:nl + 1 + size]
            self._record(payload)

    def _record(self, payload: bytes) -> None:
        rec = json.loads(payload)
        kind = rec[0] if type(rec) is list and rec else None
        index = rec[1] if kind in ("out", "err") and len(rec) == 3 else None
        if self.ended:
            self.violation = "record after end"
        elif kind == "end" and len(rec) == 1:
            self.ended = True
        elif kind == "load" and len(rec) == 2 and type(rec[1]) is str and not self.seen \
                and self.load_error is None:
            self.load_error = rec[1][:300]
        elif type(index) is int and 0 <= index < len(self.outputs) and index not in self.seen \
                and self.load_error is None and (kind == "out" or type(rec[2]) is str):
            if kind == "out":
                self.outputs[index] = decode_value(rec[2])
            else:
                self.errors[index] = rec[2][:300]
            self.seen.add(index)
        else:
            self.violation = f"unexpected record {str(kind)[:20]!r}"
