"""Shared part of the Python client round trips (kafka-python, confluent-kafka).

Each script gives run() a backend with produce / consume / list_offset; run()
makes the records, drives the backend and compares byte for byte. The topic is
auto-created by the first produce (the broker's default partition count, so
everything goes to partition 0). Exit status 0 means every check passed; the
checks that failed are printed, one per line, prefixed with FAIL.
"""

import argparse
import sys
import time

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
BIG_VALUE_SIZE = 900 * 1024


def make_records(base_ms):
    """Records of every codec, with strictly increasing timestamps 2 ms apart."""
    recs = []
    seq = 0
    for codec in CODECS:
        kinds = ["normal", "empty_key", "normal", "null_key", "normal",
                 "empty_value", "normal", "null_value", "normal"]
        if codec == "none":
            kinds.append("big")
        for kind in kinds:
            tag = "%s-%04d" % (codec, seq)
            key = ("key-" + tag).encode()
            value = ("value %s " % tag).encode() * (1 + seq % 50) + bytes(range(256))[seq % 7:]
            headers = [("seq", str(seq).encode()), ("codec", codec.encode())]
            if seq % 3 == 0:
                headers += [("bin", bytes([0, 1, 2, 0x7F, 0x80, 0xFE, 0xFF])),
                            ("dup", b"first"), ("dup", b"second")]
            elif seq % 3 == 1:
                headers += [("empty-value", b"")]
            if kind == "empty_key":
                key = b""
            elif kind == "null_key":
                key = None
            elif kind == "empty_value":
                value = b""
            elif kind == "null_value":
                value = None
            elif kind == "big":
                value = bytes((i * 7 + i // 13) % 251 for i in range(BIG_VALUE_SIZE))
            recs.append({"seq": seq, "codec": codec, "kind": kind, "key": key, "value": value,
                         "headers": headers, "ts": base_ms + 2 * seq, "offset": None})
            seq += 1
    return recs


def show(b):
    if b is None:
        return "null"
    if len(b) > 24:
        return "%r...(%d bytes)" % (b[:24], len(b))
    return repr(b)


def norm_headers(hs):
    # An empty header value may come back as None; compare the bytes.
    return [(k, v if v is not None else b"") for k, v in (hs or [])]


def check(want, got, errors, nulls_distinct=True):
    if len(got) != len(want):
        errors.append("consumed %d records, produced %d" % (len(got), len(want)))
    for i, g in enumerate(got):
        if g["offset"] != i:
            errors.append("record #%d has offset %d, want %d (contiguous from 0)" % (i, g["offset"], i))
            break
    for w, g in zip(want, got):
        where = "seq %d (%s, %s)" % (w["seq"], w["codec"], w["kind"])
        if g["partition"] != 0:
            errors.append("%s: partition %d, want 0" % (where, g["partition"]))
        if g["offset"] != w["offset"]:
            errors.append("%s: consumed at offset %s, producer was told %s" % (where, g["offset"], w["offset"]))
        for field in ("key", "value"):
            a, b = g[field], w[field]
            same = a == b if nulls_distinct else (a or b"") == (b or b"")
            if not same:
                errors.append("%s: %s %s, want %s" % (where, field, show(a), show(b)))
        if norm_headers(g["headers"]) != norm_headers(w["headers"]):
            errors.append("%s: headers %r, want %r" % (where, g["headers"], w["headers"]))
        if g["ts"] != w["ts"]:
            errors.append("%s: timestamp %s, want %d" % (where, g["ts"], w["ts"]))


def offset_queries(recs):
    """(name, ts, wanted offset) with ts -2 earliest, -1 latest; None = no offset."""
    n = len(recs)
    mid = n // 2
    a, b = recs[mid - 1], recs[mid]
    return [
        ("earliest", -2, 0),
        ("latest", -1, n),
        ("before-first", recs[0]["ts"] - 1000, 0),
        ("exact", b["ts"], b["offset"]),
        ("between", a["ts"] + 1, b["offset"]),
        ("after-last", recs[-1]["ts"] + 1000, None),
    ]


def run(name, make_backend):
    ap = argparse.ArgumentParser(description="%s round trip against a Kafka broker" % name)
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    args = ap.parse_args()

    errors = []
    started = time.time()
    backend = make_backend(args.bootstrap, args.topic)
    try:
        recs = make_records(int(time.time() * 1000) - 5 * 60 * 1000)
        for codec in CODECS:
            batch = [r for r in recs if r["codec"] == codec]
            backend.produce(codec, batch)
            print("produced %d records with %s" % (len(batch), codec))
        got = backend.consume(len(recs))
        print("consumed %d records" % len(got))
        check(recs, got, errors, nulls_distinct=getattr(backend, "nulls_distinct", True))
        if not errors:
            for qname, ts, want in offset_queries(recs):
                got_off = backend.list_offset(ts)
                print("list offsets %s (ts %d): %s" % (qname, ts, got_off))
                if got_off != want:
                    errors.append("list offsets %s (ts %d): %s, want %s" % (qname, ts, got_off, want))
    finally:
        backend.close()
    for e in errors[:40]:
        print("FAIL " + e)
    print("%s: %d records, %d errors, %.1fs" % (name, len(recs), len(errors), time.time() - started))
    sys.exit(1 if errors else 0)
