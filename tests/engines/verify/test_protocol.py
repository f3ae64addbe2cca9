"""The child protocol under hostile records: the candidate shares the child's process, so it can find the
nonce and the result pipe and write any bytes there. Whatever it writes, the parent never raises, only
that job fails (`protocol_error`), and honest jobs of the same batch keep their verdicts."""

from __future__ import annotations

import json
import random

import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.verify.child import MAX_DEPTH, Opaque, ProtocolError, decode_value, encode_value, make_encoder
from sage.engines.verify.outputs import outputs_equal, score_outputs, storable
from sage.engines.verify.protocol import Records
from sage.engines.verify.sandbox import Job, Sandbox, available_backends

BACKENDS = available_backends()
NONCE = "ab" * 16

# Writes BODY as a well-framed record (or FRAME verbatim) on the real result pipe, then exits at once.
WRITER = (
    "import os, sys\n"
    "def f(*args):\n"
    "    fr = sys._getframe(1).f_locals\n"
    "    nonce, fd = fr['nonce'], fr['fd_out']\n"
    "    body = __BODY__\n"
    "    frame = __FRAME__\n"
    "    if frame is None:\n"
    "        frame = nonce + b' ' + str(len(body)).encode() + b'\\n' + body\n"
    "    while frame:\n"
    "        frame = frame[os.write(fd, frame):]\n"
    "    os._exit(0)\n")


def writer(body: bytes = b"", frame: bytes | None = None) -> str:
    return WRITER.replace("__BODY__", repr(body)).replace("__FRAME__", repr(frame))


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


# Records the honest child never writes; each must fail its job with protocol_error.
HOSTILE = {
    "object_record": b"{}",
    "bad_int_hex": b'["out",0,{"t":"int","v":"zz"}]',
    "bare_object_value": b'["out",0,{}]',
    "unknown_tag": b'["out",0,{"t":"pwned","v":1}]',
    "tuple_of_int": b'["out",0,{"t":"tuple","v":5}]',
    "dict_bad_items": b'["out",0,{"t":"dict","v":[[1]]}]',
    "complex_of_str": b'["out",0,{"t":"complex","v":["a","b"]}]',
    "arrays_900_deep": b'["out",0,' + deep(900) + b"]",
    "arrays_100k_deep": b'["out",0,' + deep(100_000) + b"]",
    "tuples_deep": b'["out",0,' + b'{"t":"tuple","v":[' * 300 + b"]}" * 300 + b"]",
    "huge_decimal_int": b'["out",0,' + b"9" * 100_000 + b"]",
    "index_bool": b'["out",true,1]',
    "index_out_of_range": b'["out",7,1]',
    "err_not_str": b'["err",0,[1,2]]',
    "load_not_str": b'["load",{"a":1}]',
    "end_with_extra": b'["end",1]',
    "not_json": b"\xff\xfe not json",
    "empty_list": b"[]",
    "number_record": b"42",
}
FRAMES = {  # framing problems: the header itself is wrong
    "wrong_nonce": b"0" * 32 + b' 7\n["end"]',
    "header_without_newline": b"x" * 200,
    "negative_length": b"__NONCE__ -5\n[]",
    "length_too_large": b"__NONCE__ 999999999999\n[]",
    "length_too_many_digits": b"__NONCE__ " + b"9" * 40 + b"\n[]",
}


def _frame_writer(frame: bytes) -> str:
    code = writer(frame=frame)
    return code.replace("frame = " + repr(frame), f"frame = {frame!r}.replace(b'__NONCE__', nonce)")


def _fuzz_bodies(n: int, seed: int = 17) -> list[bytes]:
    rng = random.Random(seed)
    atoms = [b"0", b"-1", b"1e999", b"NaN", b"true", b"null", b'"x"', b'{"t":"int","v":"-ff"}', b'{"t":"set","v":[[]]}',
             b'{"t":"bytes","v":"0g"}', b'{"t":"repr","v":1,"type":2}', b'{"t":"dict","v":[[[1],2]]}', b"[", b"]", b","]
    bodies = []
    for _ in range(n):
        mode = rng.random()
        if mode < 0.3:
            bodies.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))))
        elif mode < 0.7:
            value = b"".join(rng.choice(atoms) for _ in range(rng.randrange(1, 6)))
            bodies.append(b'["' + rng.choice([b"out", b"err", b"load", b"end"]) + b'",0,' + value + b"]")
        else:
            good = json.dumps(["out", 0, encode_value(rng.choice([(1, [2]), {3: b"x"}, 2**80, {1, 2}]))]).encode()
            cut = rng.randrange(len(good))
            bodies.append(good[:cut] + bytes([rng.randrange(256)]) + good[cut + 1:])
    return bodies


# ------------------------------------------------------------------------------------------ in process


def test_records_never_raise_on_fuzzed_bytes():
    rng = random.Random(5)
    pieces = list(HOSTILE.values()) + _fuzz_bodies(400)
    for _ in range(600):
        rec = Records(NONCE, 2, 1 << 20)
        body = rng.choice(pieces)
        stream = (NONCE + f" {len(body)}\n").encode() + body
        if rng.random() < 0.3:
            stream = stream[:rng.randrange(len(stream) + 1)]
        if rng.random() < 0.3:
            stream = bytes(rng.randrange(256) for _ in range(rng.randrange(100))) + stream
        for i in range(0, len(stream), rng.randrange(1, 64)):
            rec.feed(stream[i:i + 64])
        assert rec.violation is None or isinstance(rec.violation, str)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_record_is_a_violation(name):
    rec = Records(NONCE, 1, 1 << 20)
    body = HOSTILE[name]
    rec.feed((NONCE + f" {len(body)}\n").encode() + body)
    assert rec.violation and rec.outputs == [None]


def test_decode_is_bounded_in_depth_and_keeps_honest_values():
    ok = [1]
    for _ in range(MAX_DEPTH - 1):
        ok = [ok]
    assert decode_value(json.loads(json.dumps(encode_value(ok)))) == ok
    with pytest.raises(ProtocolError):
        decode_value([[ok]])


MERSENNE = (1 << 61) - 1  # ints equal modulo this have equal hashes
COLLIDING_SET = json.dumps(["out", 0, {"t": "set", "v": [MERSENNE * k for k in range(36_000)]}]).encode()


def _framed(values: list, budget: int) -> bytes:
    """The records an honest child writes for `values` under an encoder budget, as the parent reads them."""
    encode, stream = make_encoder(budget), b""
    for i, value in enumerate(values):
        body = json.dumps(["out", i, encode(value)], separators=(",", ":")).encode()
        stream += (NONCE + f" {len(body)}\n").encode() + body
    return stream


@pytest.mark.parametrize("value", [b"\xff" * (100 << 10), 1 << 1_000_000, -(1 << 200_000), "é\u2028\x00" * 40_000,
                                   [1e-300 * k for k in range(20_000)], {k: (k, [k]) for k in range(8_000)}],
                         ids=["bytes_100KiB", "int_2^1e6", "negative_int", "escaped_str", "floats", "dict"])
def test_the_decoder_accepts_everything_the_encoder_sends_within_its_budget(value):
    """The child's budget (9/10 of max_output_bytes) charges each value at least its JSON length, so what it
    lets through fits the record the parent accepts (max_output_bytes + 4096), and decodes to the value."""
    max_output_bytes = 1_000_000
    rec = Records(NONCE, 1, max_output_bytes + 4096)
    rec.feed(_framed([value], max_output_bytes * 9 // 10))
    assert rec.violation is None and outputs_equal(value, rec.outputs[0])


def test_a_set_with_colliding_hashes_decodes_to_opaque_in_linear_time():
    rec = Records(NONCE, 1, 1 << 20)
    rec.feed((NONCE + f" {len(COLLIDING_SET)}\n").encode() + COLLIDING_SET)
    assert rec.violation is None and isinstance(rec.outputs[0], Opaque)
    few = decode_value({"t": "set", "v": [MERSENNE * k for k in range(20)]})  # a few collisions: a real set
    assert few == {MERSENNE * k for k in range(20)}


@pytest.mark.timeout(60)
def test_a_reordered_dict_and_set_compare_in_n_log_n():
    """A right answer whose items come in another order (quadratic before: 98 s at 8,000 items)."""
    expected = {k: [k, str(k)] for k in range(50_000)}
    actual = dict(reversed(list(expected.items())))
    assert outputs_equal(expected, actual)
    assert outputs_equal(set(range(50_000)), {float(k) for k in reversed(range(50_000))})
    actual[0] = [0, "1"]
    assert not outputs_equal(expected, actual)


def test_outputs_json_cannot_write_are_not_storable_and_raise_nothing():
    """A reference returning an int past Python's 4,300-digit str limit: its task is dropped, the stage goes on."""
    assert storable([1 << 20_000]) is None and storable([{(1, 2): 3}]) is None  # a dict keyed by tuples too
    assert storable([[1, 2.5]]) == [[1, 2.5]]


def test_comparison_never_raises_and_finds_tolerant_matches():
    """An int past a float's range against a float (float() overflows) is unequal, not an exception that fails
    the stage; a small set whose float items pair up only across the sort order still matches."""
    assert not outputs_equal(1.5, 10**400) and not outputs_equal([10**400], [1.0]) and not outputs_equal(1j, 10**400)
    assert outputs_equal(10**400, 10**400)
    assert outputs_equal({(0.3, "a"), (0.30000000000000004, "b")}, {(0.30000000000000004, "a"), (0.3, "b")})
    assert outputs_equal({0.3: "a", 0.30000000000000004: "b"}, {0.30000000000000004: "a", 0.3: "b"})
    assert not outputs_equal({(0.3, "a"), (0.5, "b")}, {(0.3, "b"), (0.5, "a")})


@pytest.mark.timeout(60)
def test_a_deeply_nested_value_compares_in_time_linear_in_its_size():
    """Each dict level's sort keys are computed once per comparison (12.9 s at 95 levels before, size x depth)."""
    value: dict = {"b": 0, "x": ["q"] * 150_000}
    for _ in range(95):
        value = {"a": value, "b": 0}
    assert outputs_equal(value, json.loads(json.dumps(value)))


# ------------------------------------------------------------------------------------------ real children


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_record_that_is_slow_to_decode_cannot_stall_a_neighbour(backend):
    hostile = Job(writer(COLLIDING_SET), "f", [[]])
    honest = [Job("def f(x):\n    return {x: [x] * 3}\n", "f", [[i]]) for i in range(4)]
    results = Sandbox(SandboxConfig(backend=backend, timeout_s=5, workers=2)).execute([hostile, *honest])
    assert isinstance(results[0].outputs[0], Opaque)
    for i, res in enumerate(results[1:]):
        assert (res.status, res.outputs) == ("ok", [{i: [i] * 3}]), (res.status, res.errors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_right_answers_pass(backend):
    """Returned bytes over 32 KiB and ints over 2**262144 failed with protocol_error."""
    code = "def f(k):\n    return [b'\\x01' * (40 << 10), 1 << 300_000][k]\n"
    res = Sandbox(SandboxConfig(backend=backend, timeout_s=10, workers=1)).execute([Job(code, "f", [[0], [1]])])[0]
    assert res.status == "ok", (res.status, res.errors)
    assert score_outputs([b"\x01" * (40 << 10), 1 << 300_000], res)[0] == 1.0



@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_writer_fails_only_itself(backend):
    honest = [Job("def f(x):\n    return (x, [x * 2], {x: str(x)})\n", "f", [[i], [i + 1]]) for i in range(5)]
    hostile = Job(writer(HOSTILE["bad_int_hex"]), "f", [[0], [1]])
    deep_one = Job(writer(HOSTILE["arrays_900_deep"]), "f", [[0]])
    jobs = honest[:2] + [hostile] + honest[2:] + [deep_one]
    results = Sandbox(SandboxConfig(backend=backend, timeout_s=10, workers=4)).execute(jobs)
    statuses = [r.status for r in results]
    assert statuses == ["ok", "ok", "protocol_error", "ok", "ok", "ok", "protocol_error"], statuses
    for job, res in zip(honest, results[:2] + results[3:6]):
        i = job.inputs[0][0]
        assert score_outputs([(i, [i * 2], {i: str(i)}), (i + 1, [i * 2 + 2], {i + 1: str(i + 1)})], res)[0] == 1.0
    assert results[2].outputs == [None, None] and results[2].errors[0].startswith("protocol violation")


@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzzed_records_through_a_real_child(backend):
    hostile = [writer(b) for b in HOSTILE.values()] + [_frame_writer(f) for f in FRAMES.values()]
    fuzzed = [writer(b) for b in _fuzz_bodies(24, seed=hash(backend) % 1000)]
    truncated = [
        "import os, sys\ndef f():\n    fr = sys._getframe(1).f_locals\n"
        "    os.write(fr['fd_out'], fr['nonce'] + b' 100\\n[\"out\",0,')\n    os._exit(0)\n"]
    jobs = [Job(code, "f", [[]]) for code in hostile + fuzzed + truncated]
    results = Sandbox(SandboxConfig(backend=backend, timeout_s=10, workers=4)).execute(jobs)  # never raises
    assert len(results) == len(jobs)
    known = {"ok", "error", "timeout", "memory", "crashed", "output_limit", "protocol_error"}
    assert all(r.status in known and len(r.outputs) == 1 for r in results)
    by_name = dict(zip(list(HOSTILE) + list(FRAMES), results))
    for name, res in by_name.items():
        assert res.status == "protocol_error", (name, res.status, res.errors)
    assert results[-1].status == "crashed"  # a truncated frame, then exit: no end record
