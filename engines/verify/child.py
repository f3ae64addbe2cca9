"""The sandbox's child side and the typed value codec shared by both sides.

This file runs twice over: the parent (`engines/verify/sandbox.py`) imports it for `encode_value`/`decode_value`,
and its whole source is handed to a fresh system interpreter (`python3 -I -S -c <source> ...`) inside the
sandbox, where `__name__ == "__main__"` runs `main()`. It therefore uses the standard library only and
must stay importable by any Python >= 3.8.

Child protocol. argv: `fd_in fd_out [chroot ROOT UID GID]` (or a zygote's fork calls `run(job, fd_out)`,
see `zygote.py`). The parent writes one `marshal`-ed job in a length-prefixed frame (data only: code text,
entry point, inputs, nonce, limits; a check job's harness in a second frame) to `fd_in` and closes it; marshal keeps
tuples/sets/bytes and avoids importing `json` (and `re`) in the child. The child reads it, optionally
builds its own root (unshare backend: mounts, chroot, drop to UID/GID), sets hard=soft rlimits, grabs
private references to everything it needs (pipe fd, writer, C JSON encoder, builtins), and only then
compiles and runs the untrusted code in a fresh namespace. Every record it writes to `fd_out` is
`<nonce> <length>\\n<json>`: `["out", i, value]`, `["err", i, message]`, `["load", message]`, then
`["end"]`. The parent decides pass/fail; expected outputs never enter the child. A job with a `harness`
(a check: HumanEval's, MBPP's asserts) runs its code in a second process and the trusted harness here
(`_harness`), so nothing the candidate does reaches the records. Every job runs under a seccomp filter
(`_seccomp`) that keeps it from kernel keys and from other processes' limits, priority and scheduling.
"""

# Typed encoding (JSON-compatible): None, bool, str, float and small ints map to themselves, lists to
# arrays; everything else is an object {"t": tag, "v": payload}, so plain JSON objects never appear
# untagged and bool/int/float/tuple/set/dict-with-any-keys all survive the round trip.
SMALL_INT = 1 << 62
MAX_DEPTH = 100


class OutputLimit(Exception):
    """The encoded value would exceed the byte budget."""


class Opaque:
    """A value the child could only describe by its repr; never equal to anything (not even itself)."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name, text):
        self.type_name, self.text = type_name, text

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __repr__(self):
        return f"Opaque({self.type_name}: {self.text})"


class Remote(Opaque):
    """A check job's handle on an object of the candidate's that has no typed encoding (an instance of a class
    the candidate defined, MBPP's `Pair`): the harness can hand it back to the candidate as an argument, where
    it is the object again (`_harness`), but never compares it or looks inside."""

    __slots__ = ("ref",)

    def __init__(self, type_name, ref):
        Opaque.__init__(self, type_name, f"<{type_name} object of the candidate's>")
        self.ref = ref


def make_encoder(budget, refs=None):
    """An encoder closure holding private references to builtins, so later patching cannot reach it.
    Raises OutputLimit once the values encoded so far pass `budget` bytes of JSON: each value is charged at
    least its JSON length (escapes included) plus a separator, so whatever fits the budget fits the record
    the parent accepts.

    A subclass of a builtin type is encoded as its base type would be, read through the base type's own
    methods (a `Counter` or `defaultdict` as a dict, a namedtuple as a tuple, an `IntEnum` as an int), so it
    compares as Python compares it with a value of the base type, and an `__eq__` or `__iter__` it overrides
    is never called. An iterator (a generator, `map`) is consumed into the items a check would consume, and
    decodes to an iterator over them; a `Fraction` or `Decimal` decodes to itself. With `refs` (a check job's
    candidate side) an object of no other type is kept in `refs` and sent as a handle (`Remote`)."""
    try:
        from _json import encode_basestring_ascii as _escaped
    except ImportError:  # an interpreter without the C accelerator: the worst case, six bytes a character
        def _escaped(text):
            return " " * (6 * len(text) + 2)
    _type, _len, _repr, _str, _fmt = type, len, repr, str, int.__format__
    _NoneT, _bool, _int, _float, _list, _tuple, _dict = type(None), bool, int, float, list, tuple, dict
    _set, _fset, _bytes, _barr, _complex = set, frozenset, bytes, bytearray, complex
    _items, _hex, _BaseExc, _OutputLimit = dict.items, bytes.hex, BaseException, OutputLimit
    _issub, _hasattr, _modules = issubclass, hasattr, __import__("sys").modules
    _as_int, _as_float, _as_str = int.__int__, float.__float__, str.__str__
    _list_iter, _tuple_iter, _set_iter, _fset_iter = list.__iter__, tuple.__iter__, set.__iter__, frozenset.__iter__
    left = [budget]

    def spend(n):
        left[0] -= n
        if left[0] < 0:
            raise _OutputLimit(f"output exceeds {budget} bytes")

    def tag(name, payload):  # {"t":"<name>","v":<payload>}: 14 bytes and the name's, and the payload's own
        spend(_len(name) + 15)
        return {"t": name, "v": payload}

    def pair(k, x, depth):
        spend(3)
        return [enc(k, depth), enc(x, depth)]

    def enc(v, depth):
        if depth > MAX_DEPTH:
            raise ValueError("value nested too deeply")
        t = _type(v)
        if t is _NoneT or t is _bool:
            spend(6)
            return v
        if t is _float:
            spend(25)  # the longest repr of a double, with its sign, and a separator
            return v
        if t is _str:
            spend(_len(v) + 1)  # what no escape can shorten: an oversized string fails before it is escaped
            spend(_len(_escaped(v)) - _len(v))
            return v
        if t is _int:
            if -SMALL_INT < v < SMALL_INT:
                spend(21)
                return v
            s = _fmt(v, "x")
            spend(_len(s) + 3)
            return tag("int", s)
        if t is _list:
            spend(3)
            return [enc(x, depth + 1) for x in v]
        if t is _tuple:
            spend(3)
            return tag("tuple", [enc(x, depth + 1) for x in v])
        if t is _set or t is _fset:
            spend(3)
            return tag("set", [enc(x, depth + 1) for x in v])
        if t is _dict:
            spend(3)
            return tag("dict", [pair(k, x, depth + 1) for k, x in _items(v)])
        if t is _bytes or t is _barr:
            spend(2 * _len(v) + 3)
            return tag("bytes", _hex(_bytes(v)))
        if t is _complex:
            spend(52)
            return tag("complex", [v.real, v.imag])
        base = subclass(v, t, depth)
        if base is not None:
            return base
        try:
            text = _str(_repr(v))[:200]
        except _BaseExc:
            text = "<unrepresentable>"
        try:
            name = _str(t.__name__)[:100]
        except _BaseExc:
            name = "?"
        spend(_len(_escaped(text)) + _len(_escaped(name)) + 32)
        if refs is not None:
            refs.append(v)
            return {"t": "ref", "v": _len(refs) - 1, "type": name}
        return {"t": "repr", "v": text, "type": name}

    def subclass(v, t, depth):
        """`v` as its builtin base type, a number type of the standard library or an iterator would be
        encoded; None for anything else."""
        if _issub(t, _bool):
            return None
        if _issub(t, _int):
            return enc(_as_int(v), depth)
        if _issub(t, _float):
            return enc(_as_float(v), depth)
        if _issub(t, _str):
            return enc(_as_str(v), depth)
        if _issub(t, _dict):
            spend(3)
            return tag("dict", [pair(k, x, depth + 1) for k, x in _items(v)])
        if _issub(t, _list) or _issub(t, _tuple):
            spend(3)
            items = [enc(x, depth + 1) for x in (_list_iter(v) if _issub(t, _list) else _tuple_iter(v))]
            return items if _issub(t, _list) else tag("tuple", items)
        if _issub(t, _set) or _issub(t, _fset):
            spend(3)
            return tag("set", [enc(x, depth + 1) for x in (_set_iter(v) if _issub(t, _set) else _fset_iter(v))])
        fractions, decimal = _modules.get("fractions"), _modules.get("decimal")
        if fractions is not None and _issub(t, fractions.Fraction):
            n, d = v.numerator, v.denominator
            if _type(n) is _int and _type(d) is _int:
                spend(3)
                return tag("fraction", [enc(n, depth + 1), enc(d, depth + 1)])
            return None
        if decimal is not None and _issub(t, decimal.Decimal):
            text = _str(v)
            spend(_len(text) + 3)
            return tag("decimal", text)
        if _hasattr(t, "__next__") and _hasattr(t, "__iter__"):
            spend(3)
            return tag("iter", [enc(x, depth + 1) for x in v])
        return None

    def encode(v):  # the budget is shared by every value encoded with this encoder, until `reset`
        return enc(v, 0)

    def reset():
        left[0] = budget

    encode.reset = reset
    return encode


def encode_value(value, budget=1 << 62):
    """Typed, JSON-compatible tree of `value` (raises OutputLimit past `budget` approximate bytes)."""
    return make_encoder(budget)(value)


class ProtocolError(ValueError):
    """A record from the child that the honest encoder could not have written."""


_SCALARS = (type(None), bool, int, float, str)
# Items of one decoded set or dict that may share a hash value. Building a set costs a comparison per pair of
# items with equal hashes, so ~41,000 crafted ints (equal modulo 2**61 - 1) held the parent for half a minute;
# past this many, the value is decoded as an Opaque, which never equals anything.
MAX_SHARED_HASH = 32
# A Fraction's terms and a Decimal's digits past these decode as Opaque: both compare by arithmetic on them.
MAX_FRACTION_BITS = 1 << 16
MAX_DECIMAL_CHARS = 10_000


def _hashes_spread(items):
    """Can `items` go into a set or dict in linear time: no hash value shared by more than MAX_SHARED_HASH of
    them? (Unhashable items: True, the caller's TypeError handles them.)"""
    counts = {}
    for item in items:
        try:
            h = hash(item)
        except TypeError:
            return True
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_SHARED_HASH:
            return False
    return True


def decode_value(node, depth=0, remote=False):
    """Inverse of encode_value, strict and linear in the record's size: anything the honest encoder cannot
    produce (an unknown tag, a payload of the wrong type, nesting past MAX_DEPTH) raises ProtocolError.
    Sizes are bounded by the record's (the parent caps records at the job's output budget), so every int and
    bytes value the encoder sends within that budget decodes. Sets and dicts whose items cannot be hashed, or
    whose hashes collide (`MAX_SHARED_HASH`), become Opaque: never equal to an expected value. Handles on the
    candidate's objects (`Remote`) are accepted only where `remote` (a check job's harness reading the
    candidate's replies)."""
    if depth > MAX_DEPTH + 1:
        raise ProtocolError("value nested too deeply")
    t = type(node)
    if t in _SCALARS:
        return node
    if t is list:
        return [decode_value(x, depth + 1, remote) for x in node]
    if t is not dict:
        raise ProtocolError("not a JSON value")
    tag, v = node.get("t"), node.get("v")
    keys = {"t", "v", "type"} if tag in ("repr", "ref") else {"t", "v"}
    if set(node) != keys:
        raise ProtocolError("bad tagged value")
    if tag in ("tuple", "set", "iter") and type(v) is list:
        items = [decode_value(x, depth + 1, remote) for x in v]
        if tag == "tuple":
            return tuple(items)
        if tag == "iter":
            return iter(items)
        if not _hashes_spread(items):
            return Opaque("set", f"{len(items)} items with colliding hashes")
        try:
            return set(items)
        except TypeError:
            return Opaque("set", f"{len(items)} items, some unhashable")
    if tag == "dict" and type(v) is list:
        pairs = []
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise ProtocolError("bad dict item")
            pairs.append((decode_value(pair[0], depth + 1, remote), decode_value(pair[1], depth + 1, remote)))
        if not _hashes_spread([key for key, _ in pairs]):
            return Opaque("dict", f"{len(pairs)} items with colliding key hashes")
        try:
            return dict(pairs)
        except TypeError:
            return Opaque("dict", f"{len(pairs)} items, some keys unhashable")
    if tag in ("int", "bytes") and type(v) is str:
        try:
            return int(v, 16) if tag == "int" else bytes.fromhex(v)  # both linear in the digits
        except ValueError:
            raise ProtocolError("bad hex payload") from None
    if tag == "complex" and type(v) is list and len(v) == 2 and all(type(x) in (int, float) for x in v):
        return complex(v[0], v[1])
    if tag == "repr" and type(v) is str and type(node["type"]) is str:
        return Opaque(node["type"][:100], v[:200])
    if tag == "ref" and remote and type(v) is int and v >= 0 and type(node["type"]) is str:
        return Remote(node["type"][:100], v)
    if tag == "fraction" and type(v) is list and len(v) == 2:
        n, d = decode_value(v[0], depth + 1), decode_value(v[1], depth + 1)
        if type(n) is not int or type(d) is not int or d <= 0:
            raise ProtocolError("bad fraction")
        if max(n.bit_length(), d.bit_length()) > MAX_FRACTION_BITS:  # normalising it would take quadratic time
            return Opaque("Fraction", "too large to compare")
        return __import__("fractions").Fraction(n, d)
    if tag == "decimal" and type(v) is str:
        if len(v) > MAX_DECIMAL_CHARS:
            return Opaque("Decimal", "too long to compare")
        try:
            return __import__("decimal").Decimal(v)
        except ArithmeticError:
            raise ProtocolError("bad decimal") from None
    raise ProtocolError(f"bad tagged value {str(tag)[:20]!r}")


# ----------------------------------------------------------------------------------------- child side


def _read_frame(os, fd, limit=1 << 62):
    """One `<8-byte big-endian length><bytes>` frame from `fd`; None at end of file, for a frame cut short, or
    for one longer than `limit` (which is not read: a hostile writer's length is no allocation)."""
    head = _read_exact(os, fd, 8)
    size = int.from_bytes(head, "big") if len(head) == 8 else -1
    if not 0 <= size <= limit:
        return None
    body = _read_exact(os, fd, size)
    return body if len(body) == size else None


def _write_frame(os, fd, data):
    """Write `data` to `fd` as one `_read_frame` frame."""
    data = memoryview(len(data).to_bytes(8, "big") + data)
    while data:
        data = data[os.write(fd, data):]


def _close_all_but(os, keep):
    """Close every descriptor above stdio but the two in `keep`."""
    low, high = sorted(keep)
    os.closerange(3, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, 1 << 16)


def _compact_json():
    """The C JSON encoder, compact and ASCII, as the records are written (`"".join(encoder(value, 0))`)."""
    from _json import encode_basestring_ascii
    from _json import make_encoder as c_make_encoder

    return c_make_encoder(None, None, encode_basestring_ascii, None, ":", ",", False, False, True)


def _read_job(os, fd):
    """The job (marshal, one frame). A check job's harness follows in a second frame, read only after the
    candidate's process is forked (`_harness`), so the candidate's memory never holds it: `fd` stays open for it
    as `job["harness_fd"]`; otherwise it is closed."""
    job = __import__("marshal").loads(_read_frame(os, fd) or b"")
    if job.get("harness"):
        job["harness_fd"] = fd
    else:
        os.close(fd)
    return job


def _read_all(os, fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks)


def _enter_root(os, root, uid, gid, job):
    """unshare backend: private mounts, a tmpfs root with read-only /usr, chroot, then drop to uid/gid."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18

    def mount(src, tgt, fs, flags, data=None):
        enc = lambda s: None if s is None else s.encode()  # noqa: E731
        if libc.mount(enc(src), enc(tgt), enc(fs), ctypes.c_ulong(flags), enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {tgt}: {os.strerror(err)}")

    def bind_ro(src, tgt):
        mount(src, tgt, None, BIND | REC)
        mount(None, tgt, None, BIND | REMOUNT | RDONLY | NOSUID | NODEV)

    mount(None, "/", None, REC | PRIVATE)
    mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "size=1m,nr_inodes=256,mode=0755")
    for d in ("usr", "proc", "tmp", "work", "dev"):
        os.mkdir(root + "/" + d)
    bind_ro("/usr", root + "/usr")
    for d in ("bin", "lib", "lib64", "sbin", "lib32", "libx32"):
        if os.path.islink("/" + d):
            os.symlink(os.readlink("/" + d), root + "/" + d)
        elif os.path.isdir("/" + d):
            os.mkdir(root + "/" + d)
            bind_ro("/" + d, root + "/" + d)
    for extra in job.get("ro_dirs", []):
        os.makedirs(root + extra, exist_ok=True)
        bind_ro(extra, root + extra)
    mount("proc", root + "/proc", "proc", NOSUID | NODEV | NOEXEC)
    bind_ro(root + "/proc/sys", root + "/proc/sys")  # kernel settings: see `isolation.command`
    size = f"size={job['tmpfs_bytes']},nr_inodes={job['tmpfs_inodes']}"
    mount("tmpfs", root + "/tmp", "tmpfs", NOSUID | NODEV, size + ",mode=1777")
    # root-owned like /tmp: a job may write in it, never change its mode, times or attributes for the next job
    mount("tmpfs", root + "/work", "tmpfs", NOSUID | NODEV, size + ",mode=1777")
    mount("tmpfs", root + "/dev", "tmpfs", NOSUID | NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for dev in ("null", "zero", "urandom", "random"):
        open(root + "/dev/" + dev, "w").close()
        mount("/dev/" + dev, root + "/dev/" + dev, None, BIND)
    os.chroot(root)
    os.chdir("/work")
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _die_with_parent(os, parent=None):
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG). Set again after the uid changes, which
    clears it: a sandbox never outlives the pipeline that started it, even one killed outright. A parent that
    died before this call is caught by comparing with its pid, where the child can see it (no namespace)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def _owner_gone(fd_out):
    """Has the pipeline that started this job died? Then nobody reads `fd_out` any more (poll says POLLERR).
    Each process between the pipeline and this one dies with its parent once it has armed its parent-death
    signal, but one whose parent died before it armed it (`unshare` forks, then arms; a scheduler can hold
    the child in between) runs on orphaned, and so would the job. By the time this runs every one of them
    has armed: checked here once, a pipeline that dies later takes the job down with it."""
    import select

    poller = select.poll()
    poller.register(fd_out, 0)  # POLLERR and POLLHUP are reported whatever the mask
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _stay_init(os, fd_out):
    """We are pid 1 of a new pid namespace, which ignores its own fatal signals: fork, let the child run
    the job as an ordinary process, and here only wait for it (its exit ends the namespace). Pid 1 dies with
    the `unshare` process above it, and the namespace with it."""
    _die_with_parent(os)
    pid = os.fork()
    if pid == 0:
        return
    os.close(fd_out)
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if done == pid:
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF if hasattr(os, "waitstatus_to_exitcode") else 1)


# What a job's syscalls may do, per architecture: (AUDIT_ARCH, denied, calls whose arg 0 is a pid, calls with a
# "which" in arg 0 and the pid in arg 1 (setpriority: PRIO_PROCESS 0; ioprio_set: IOPRIO_WHO_PROCESS 1), calls
# made no-ops that succeed). Kernel keys are not namespaced (a key planted under a pooled uid outlives the job,
# Docker's default profile denies the same three calls). The pid calls (prlimit64, sched_setaffinity,
# sched_setscheduler, sched_setparam, sched_setattr, setpriority, ioprio_set) would reach another process of the
# job's uid: in a pid namespace the only one is pid 1, the slot's zygote above all, whose limits, priority,
# scheduling and affinity every later job in the slot inherits; so they may name any pid but 1 (0, the job's own
# pid, its children's, its threads'). setsid succeeds without leaving the job's session: a session is a
# scheduler autogroup, and a job whose 31 children each started one took 31 shares of the CPU from a neighbour.
_SECCOMP = {
    "x86_64": (0xC000003E, (248, 249, 250), (302, 203, 144, 142, 314), ((141, 0), (251, 1)), (112,)),
    "aarch64": (0xC00000B7, (217, 218, 219), (261, 122, 119, 118, 274), ((140, 0), (30, 1)), (157,)),
}


def _seccomp_program(machine, own_pid=None):
    """The classic-BPF seccomp filter for `machine` as (code, jt, jf, k) tuples, or None for an architecture
    without a table. Any other architecture's calls (x86's 32-bit and x32 ABIs) are denied; pid arguments are
    `pid_t`, of which the kernel reads the low 32 bits, so only that word is checked. With `own_pid` (a job
    outside a pid namespace, where pid 1 is not the only other process of its uid) the pid calls may name only
    0 and `own_pid`."""
    if machine not in _SECCOMP:
        return None
    arch, denied, pid_first, which_pid, no_ops = _SECCOMP[machine]
    LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
    # SECCOMP_RET_ALLOW; SECCOMP_RET_ERRNO | EPERM; SECCOMP_RET_ERRNO | 0: the call returns 0 without being made
    ALLOW, DENY, NO_OP = 0x7FFF0000, 0x00050000 | 1, 0x00050000

    def pid_allowed(offset):  # the pid argument at `offset` (16: arg 0, 24: arg 1), then ALLOW or DENY
        if own_pid is None:
            return [(LD, 0, 0, offset), (JEQ, 0, 1, 1), (RET, 0, 0, DENY), (RET, 0, 0, ALLOW)]
        return [(LD, 0, 0, offset), (JEQ, 2, 0, 0), (JEQ, 1, 0, own_pid & 0xFFFFFFFF), (RET, 0, 0, DENY),
                (RET, 0, 0, ALLOW)]

    head = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, DENY), (LD, 0, 0, 0), (JGE, 0, 1, 0x40000000),
            (RET, 0, 0, DENY)]
    tails = [(nr, pid_allowed(16)) for nr in pid_first]
    tails += [(nr, [(LD, 0, 0, 16), (JEQ, 1, 0, which), (RET, 0, 0, DENY)] + pid_allowed(24))
              for nr, which in which_pid]
    n_dispatch = len(denied) + len(no_ops) + len(tails)
    allow_at = len(head) + n_dispatch  # ALLOW, DENY, NO_OP follow the dispatch table, then the tails
    targets = [(nr, allow_at + 1) for nr in denied] + [(nr, allow_at + 2) for nr in no_ops]
    at = allow_at + 3
    for nr, tail in tails:
        targets.append((nr, at))
        at += len(tail)
    dispatch = [(JEQ, target - (len(head) + k + 1), 0, nr) for k, (nr, target) in enumerate(targets)]
    return head + dispatch + [(RET, 0, 0, ALLOW), (RET, 0, 0, DENY), (RET, 0, 0, NO_OP)] + \
        [i for _, tail in tails for i in tail]


def _seccomp(os, own_pid=None):
    """Install the seccomp filter (`_seccomp_program`) on this process and every process it starts; raises
    OSError when the kernel refuses it, so no job runs without it."""
    import ctypes

    program = _seccomp_program(os.uname().machine, own_pid)
    if program is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    insns = (Insn * len(program))(*[Insn(*i) for i in program])
    prog = Prog(len(program), insns)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # NO_NEW_PRIVS; SECCOMP
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


def _set_limits(resource, limits):
    """hard = soft for every limit (the process can only lower them further)."""
    for name, value in limits.items():
        res = getattr(resource, "RLIMIT_" + name, None)
        if res is not None:
            resource.setrlimit(res, (value, value))


def main():
    import os
    import sys

    fd_in, fd_out = int(sys.argv[1]), int(sys.argv[2])
    job = _read_job(os, fd_in)
    if _owner_gone(fd_out):
        os._exit(1)
    if len(sys.argv) > 3 and sys.argv[3] == "chroot":
        _enter_root(os, sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), job)
        _stay_init(os, fd_out)
    _die_with_parent(os, job.get("parent"))
    run(job, fd_out)


def run(job, fd_out):
    """Set the job's limits, run its code on its inputs and write the records to `fd_out`; never returns.
    Called by `main()` in a fresh interpreter, or by a warm zygote in the child it forked for this job."""
    import builtins
    import os
    import resource
    import sys

    _set_limits(resource, job["limits"])
    _seccomp(os, os.getpid() if job.get("parent") is not None else None)  # "parent": no pid namespace (rlimit)
    if "random" in sys.modules:  # imported by a warm slot's zygote: seeded afresh, as a fresh import would be
        sys.modules["random"].seed()

    # Private references, all taken before any untrusted code exists in this process.
    _write, _exit, _len, _str, _type, _BaseExc = os.write, os._exit, len, str, type, BaseException
    _enumerate = enumerate
    _json = _compact_json()
    _join, _encode_text, _mv = "".join, str.encode, memoryview
    nonce = job["nonce"].encode()
    budget = int(job["max_output_bytes"]) * 9 // 10  # room for framing and stdout
    encode = make_encoder(budget)
    inputs = job["inputs"]
    code, entry, harness_fd = job["code"], job["entry_point"], job.get("harness_fd")
    del job

    def emit(record):
        payload = _encode_text(_join(_json(record, 0)), "ascii")
        data = _mv(nonce + b" " + _encode_text(_str(_len(payload)), "ascii") + b"\n" + payload)
        while data:
            data = data[_write(fd_out, data):]

    def describe(exc):
        try:
            return (_str(_type(exc).__name__) + ": " + _str(exc))[:300]
        except _BaseExc:
            return "unprintable exception"

    def finish():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except _BaseExc:
                pass
        emit(["end"])
        _exit(0)

    sys.argv = ["solution"]
    if harness_fd is not None:  # a check job: the code runs in a process of its own, the trusted harness here
        fn, load_error = _harness(os, builtins, harness_fd, code, entry, budget, describe)
        if load_error is not None:
            emit(["load", load_error])
            finish()
    else:
        namespace = {"__name__": "__solution__", "__builtins__": builtins}
        try:
            exec(compile(code, "<solution>", "exec"), namespace)
            fn = namespace[entry]
        except _BaseExc as exc:
            emit(["load", describe(exc)])
            finish()
    for i, args in _enumerate(inputs):
        try:
            record = ["out", i, encode(fn(*args))]
        except _BaseExc as exc:
            record = ["err", i, describe(exc)]
        emit(record)
    finish()


def _read_exact(os, fd, n):
    """`n` bytes from `fd`, fewer only at end of file."""
    chunks, left = [], n
    while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def _harness(os, builtins, harness_fd, code, entry, budget, describe):
    """A check job (HumanEval's `check`, MBPP's asserts): the candidate's code must not reach what judges it.

    The candidate's program is loaded and called in a process of its own (`_candidate`), forked before any
    untrusted code exists and before the harness is read from `harness_fd` (so the candidate's memory holds no
    part of the check: its computed right-hand sides would tell a lookup table what to return), and holding none
    of this process's descriptors; this process is made non-dumpable first, so the candidate can neither ptrace
    it nor open its memory or descriptors through /proc. Here, the trusted harness source (the task's own
    helpers, its check, and a driver `__sage_harness__`) runs with the name `entry` (and `candidate`, and any
    name it uses but does not define) bound to a proxy of the candidate's function of that name: each call
    sends its arguments over a pipe (marshal: data the harness built) and decodes the reply strictly
    (`decode_value`), as the parent decodes records. So every value an assertion compares is computed here
    from what the candidate returned, and nothing the candidate writes can be taken for this process's records.
    Returns (the driver, None), or (None, the load error)."""
    import ctypes
    import json
    import marshal
    import signal

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _close_all_but(os, (req_r, rep_w))  # only its two pipe ends and stdio stay open in the candidate's process
        _die_with_parent(os)  # with this process: on rlimit no pid namespace would take the candidate down
        _candidate(os, builtins, code, req_r, rep_w, budget, describe)
    os.close(req_r)
    os.close(rep_w)
    harness = (_read_frame(os, harness_fd) or b"").decode("utf-8")
    os.close(harness_fd)

    def receive():
        body = _read_frame(os, rep_r, budget + 4096)
        if body is None:
            raise RuntimeError("the candidate's process ended or sent a malformed reply")
        rec = json.loads(body)
        if type(rec) is not list or not rec or rec[0] not in ("load", "ok", "err"):
            raise RuntimeError("malformed reply from the candidate's process")
        return rec

    mark = os.urandom(16).hex()  # a handle's mark in the arguments: no literal of the check can hold it

    def handles(value, depth=0):
        """The arguments with each `Remote` as `(mark, ref)`, which marshal carries and the candidate resolves."""
        t = type(value)
        if t is Remote:
            return (mark, value.ref)
        if depth > MAX_DEPTH or t not in (list, tuple, dict, set, frozenset):
            return value
        if t is dict:
            return {handles(k, depth + 1): handles(x, depth + 1) for k, x in value.items()}
        return t(handles(x, depth + 1) for x in value)

    def proxy(name):
        def call(*args, **kwargs):
            _write_frame(os, req_w, marshal.dumps((name, handles(args), handles(kwargs), mark), 4))
            rec = receive()
            if rec[0] == "ok" and len(rec) == 2:
                return decode_value(rec[1], remote=True)
            if rec[0] == "err" and len(rec) == 3 and type(rec[1]) is str and type(rec[2]) is str:
                cls = getattr(builtins, rec[1][:100], None)  # the candidate's own exception, where a builtin one
                raise (cls if isinstance(cls, type) and issubclass(cls, Exception) else RuntimeError)(rec[2][:300])
            raise RuntimeError("malformed reply from the candidate's process")
        return call

    def stop():
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass

    try:
        loaded = receive()
        if len(loaded) != 2 or not (loaded[1] is None or type(loaded[1]) is str):
            raise RuntimeError("malformed reply from the candidate's process")
    except Exception as exc:
        stop()
        return None, describe(exc)
    if loaded[1] is not None:
        stop()
        return None, loaded[1][:300]
    namespace = {"__name__": "__harness__", "__builtins__": builtins}
    try:
        compiled = compile(harness, "<harness>", "exec")
        exec(compiled, namespace)
        driver = namespace["__sage_harness__"]
    except Exception as exc:
        stop()
        return None, "the harness did not load: " + describe(exc)
    # Every name the harness uses but does not define is the candidate's (MBPP's asserts call its helpers by
    # name): a proxy to the candidate's global of that name.
    codes, names = [compiled], set()
    while codes:
        code_object = codes.pop()
        names.update(code_object.co_names)
        codes.extend(c for c in code_object.co_consts if type(c) is type(compiled))
    for name in names - set(namespace) - set(dir(builtins)):
        namespace[name] = proxy(name)
    namespace[entry] = namespace["candidate"] = proxy(entry)

    def run_then_stop(*args):
        try:
            return driver(*args)
        finally:
            stop()
    return run_then_stop, None


def _candidate(os, builtins, code, req_r, rep_w, budget, describe):
    """A check job's candidate side: load the program, report whether it loaded, then answer each call of the
    harness with its typed, budgeted encoding (or its exception); never returns. Whatever the program does
    to this process reaches only the replies, which the harness decodes as hostile. What the replies and
    requests go through is taken before the program runs (`os.write`, `memoryview`, the encoder's builtins), so
    a program that patches them fails its own calls at once instead of leaving both sides waiting on a frame
    until the time limit."""
    import marshal

    _json, _join, _loads, _exit = _compact_json(), "".join, marshal.loads, os._exit
    _read, _write, _mv, _len, _from_bytes, _bjoin = os.read, os.write, memoryview, len, int.from_bytes, b"".join
    _type, _int, _tuple, _dict, _containers = type, int, tuple, dict, (list, tuple, dict, set, frozenset)
    _BaseExc, _NameError = BaseException, NameError
    refs = []  # the objects the harness holds handles on (`Remote`), by handle
    encode = make_encoder(budget, refs)

    def send(record):
        data = _json(record, 0)
        data = _mv(_join(data).encode("ascii"))
        data = _mv(_len(data).to_bytes(8, "big") + data.tobytes())
        while data:
            data = data[_write(rep_w, data):]

    def read_exact(n):
        chunks, left = [], n
        while left > 0:
            b = _read(req_r, left)
            if not b:
                break
            chunks.append(b)
            left -= _len(b)
        return _bjoin(chunks)

    def request():
        head = read_exact(8)
        if _len(head) != 8:
            return None
        size = _from_bytes(head, "big")
        body = read_exact(size)
        return body if _len(body) == size else None

    def resolve(value, mark, depth=0):
        t = _type(value)
        if t is _tuple and _len(value) == 2 and value[0] == mark and _type(value[1]) is _int:
            return refs[value[1]]
        if depth > MAX_DEPTH or t not in _containers:
            return value
        if t is _dict:
            return {resolve(k, mark, depth + 1): resolve(x, mark, depth + 1) for k, x in _dict.items(value)}
        return t(resolve(x, mark, depth + 1) for x in value)

    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(code, "<solution>", "exec"), namespace)
        send(["load", None])
    except _BaseExc as exc:
        send(["load", describe(exc)])
        _exit(0)
    while True:
        body = request()
        if body is None:  # the harness is done
            _exit(0)
        name, args, kwargs, mark = _loads(body)
        try:
            if name not in namespace:
                raise _NameError(f"name {name!r} is not defined")
            args, kwargs = resolve(args, mark), resolve(kwargs, mark)
            encode.reset()
            record = ["ok", encode(namespace[name](*args, **kwargs))]
        except _BaseExc as exc:
            record = ["err", _type(exc).__name__, describe(exc)]
        send(record)


if __name__ == "__main__":
    main()
