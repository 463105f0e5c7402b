#!/usr/bin/env python3
"""Independent generator of the MetaRoCE 0-RTT vectors (spec 4.2.4, 5.3.3).

Writes every `*.vec` file in `early/` next to this script: early proofs
(the CONNECT's Cookie field under a job key, over both ends' addresses and
ports, the offer and a wall-clock time), the early CONNECTs carrying them,
the early initiator-to-acceptor key, and an early WRITE sealed with it
(flags EARLY | PROTECTED, addressed with the initiator's own id and token).

HKDF-SHA256 (RFC 5869) is written out here with Python's `hmac` and
`hashlib` (Extract = HMAC(salt, IKM), Expand = T(1) || T(2) ..., T(i) =
HMAC(PRK, T(i-1) || info || i)); AES-256-GCM is Python `cryptography`'s
(OpenSSL); the header layouts come from `generate.py`'s `struct` packing.
Nothing is shared with the Rust side (`core/src/crypto/early.rs`), so the
files are an oracle for it: `core/tests/early_vectors.rs` reads them.

Usage (from anywhere; needs `pip install cryptography`, the tests do not):

    python3 compliance/vectors/generate_early.py          # rewrite
    python3 compliance/vectors/generate_early.py --check  # exit 1 if stale

The file format is described in README.md next to this script.
"""

import hashlib
import hmac
import ipaddress
import os
import struct
import sys
import zlib

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as g  # noqa: E402  (header layouts of spec 3)

FLAG_ACK_REQUEST = 0x0001
FLAG_PROTECTED = 0x0008
FLAG_EARLY = 0x0010
PROOF_SALT = b"MetaRoCE v2 early admission"
EARLY_INFO = b"MetaRoCE v2 early AES-256-GCM"
INFO = b"MetaRoCE v2 AES-256-GCM"
TAG_LEN = 16

JOB_KEY = bytes.fromhex("4a6f62206b657920666f722074686520"
                        "3052545420766563746f727320210001")
KEY_ID = 0x0000_0001
# 2026-12-02T12:00:00.123456789Z, ns since the Unix epoch.
TIME = 1_796_212_800_123_456_789


def hkdf_extract(salt, ikm):
    return hmac.new(salt, ikm, hashlib.sha256).digest()


def hkdf_expand(prk, info, length):
    out, t, i = b"", b"", 1
    while len(out) < length:
        t = hmac.new(prk, t + info + bytes([i]), hashlib.sha256).digest()
        out += t
        i += 1
    return out[:length]


def ip16(text):
    """An address as 16 bytes, IPv4 as the mapped ::ffff:a.b.c.d."""
    a = ipaddress.ip_address(text)
    if a.version == 4:
        return bytes(10) + b"\xff\xff" + a.packed
    return a.packed


def offer(f):
    """CONNECT extension bytes 0..32: everything but the Cookie."""
    return g.extension(dict(f, cookie=bytes(32)))[:32]


def proof(f, at, time):
    """Spec 4.2.4: (message, PRK, tag, proof)."""
    head = struct.pack(">Q", time) + bytes(8)
    msg = (head + ip16(at["initiator_ip"]) + struct.pack(">H", at["initiator_port"])
           + ip16(at["acceptor_ip"]) + struct.pack(">H", at["acceptor_port"]) + offer(f))
    assert len(msg) == 84
    prk = hkdf_extract(PROOF_SALT, JOB_KEY)
    tag = hkdf_expand(prk, msg, 16)
    return msg, prk, tag, head + tag


def connect(src_conn, src_token, initial_psn, mtu=4096, max_paths=16, window=256,
            reply_port=4795, timestamp=0x0000_1000, path=16):
    return dict(type="CONNECT", flags=FLAG_EARLY, dst_conn=0, token=0, psn=initial_psn,
                path=path, timestamp=timestamp, src_conn=src_conn, src_token=src_token,
                mtu=mtu, max_paths=max_paths, window=window, reply_port=reply_port,
                timer_profile="DataCenter", suite="Aes256Gcm", initial_psn=initial_psn,
                key_id=KEY_ID)


V4 = dict(initiator_ip="10.0.0.1", initiator_port=50000, acceptor_ip="10.0.0.2",
          acceptor_port=4795)
V6 = dict(initiator_ip="fd00::a:1", initiator_port=61234, acceptor_ip="fd00::b:2",
          acceptor_port=4795)

CONNECT_V4 = connect(0x0102_0304, 0x1122_3344_5566_7788, 0x0000_004D)
CONNECT_V6 = connect(0x7fff_fff1, 0xfedc_ba98_7654_3210, 0xffff_fff0, mtu=1024,
                     max_paths=4, window=65536, reply_port=0, timestamp=0xffff_ffff, path=1)

# The acceptor's answer to CONNECT_V4: its own id, token, PSN; the
# negotiated values are the offer's (spec 4.2.4 step 4).
ACCEPT_V4 = dict(type="ACCEPT", flags=0, dst_conn=CONNECT_V4["src_conn"],
                 token=CONNECT_V4["src_token"], psn=0x2000_0002, path=16,
                 timestamp=0x0000_2000, src_conn=0x0200_0002, src_token=0x5555_6666_7777_8888,
                 mtu=4096, max_paths=16, window=256, reply_port=4795,
                 timer_profile="DataCenter", suite="Aes256Gcm", initial_psn=0x2000_0002,
                 key_id=KEY_ID, cookie=struct.pack(">I", 100_000) + bytes(28))


def early_keys(c):
    """Spec 5.3.3: the early initiator-to-acceptor key and salt."""
    prk = hkdf_extract(offer(c), JOB_KEY)
    okm = hkdf_expand(prk, EARLY_INFO, 36)
    return prk, okm


def transcript_keys(c, a):
    t = offer(c) + g.extension(a)[:32]
    okm = hkdf_expand(hkdf_extract(t, JOB_KEY), INFO, 72)
    return t, okm


def header(f, payload_len):
    return struct.pack(">BBHIQIHHI", g.VERSION, g.TYPE_CODES[f["type"]], f["flags"],
                       f["dst_conn"], f["token"], f["psn"], f["path"], payload_len,
                       f["timestamp"])


def common_lines():
    return [("job_key", JOB_KEY.hex()), ("key_id", "0x%08x" % KEY_ID)]


def connect_file(c, at, time):
    msg, prk, tag, p = proof(c, at, time)
    raw = g.packet(dict(c, cookie=p))
    lines = common_lines() + [
        ("initiator_ip", at["initiator_ip"]), ("initiator_port", str(at["initiator_port"])),
        ("acceptor_ip", at["acceptor_ip"]), ("acceptor_port", str(at["acceptor_port"])),
        ("time", str(time)), ("proof_salt", PROOF_SALT.hex()), ("offer", offer(c).hex()),
        ("message", msg.hex()), ("prk", prk.hex()), ("tag", tag.hex()), ("proof", p.hex()),
        ("flags", "0x%04x" % c["flags"]), ("bytes", raw.hex()),
    ]
    return lines


def all_files():
    files = {}
    files["early_connect"] = g.render(
        "early_connect",
        "early CONNECT (EARLY) with its proof, IPv4, computed step by step",
        connect_file(CONNECT_V4, V4, TIME))
    files["early_connect_ipv6"] = g.render(
        "early_connect_ipv6",
        "early CONNECT with its proof, IPv6 addresses, extreme offer values",
        connect_file(CONNECT_V6, V6, (1 << 64) - 1))

    # The early WRITE: sealed with the early key, the initiator's first IV,
    # addressed with its own id and token, PSN = its Initial PSN.
    c = CONNECT_V4
    _, _, _, p = proof(c, V4, TIME)
    prk, okm = early_keys(c)
    key, salt = okm[:32], okm[32:36]
    t, full = transcript_keys(c, ACCEPT_V4)
    iv = 1
    plaintext = g.pattern(64, 5)
    w = dict(type="WRITE", flags=FLAG_EARLY | FLAG_PROTECTED | FLAG_ACK_REQUEST,
             dst_conn=c["src_conn"], token=c["src_token"], psn=c["initial_psn"], path=2,
             timestamp=0x0000_1100, msg_id=0, msg_offset=0, msg_len=64, key=0x00C0_FFEE,
             addr=0x0000_7F00_1234_0000)
    security = struct.pack(">IIQ", KEY_ID, 0, iv)
    aad = header(w, len(plaintext)) + g.extension(w) + security
    nonce = salt + struct.pack(">Q", iv)
    sealed = AESGCM(key).encrypt(nonce, plaintext, aad)
    ct, tag = sealed[:-TAG_LEN], sealed[-TAG_LEN:]
    body = aad + ct + tag
    raw = body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    lines = common_lines() + [
        ("connect", g.packet(dict(c, cookie=p)).hex()),
        ("accept", g.packet(ACCEPT_V4).hex()),
        ("early_salt", offer(c).hex()), ("early_info", EARLY_INFO.hex()),
        ("early_prk", prk.hex()), ("early_okm", okm.hex()),
        ("i2a_key", key.hex()), ("i2a_salt", salt.hex()),
        ("transcript", t.hex()), ("a2i_key", full[36:68].hex()), ("a2i_salt", full[68:72].hex()),
        ("iv", str(iv)), ("nonce", nonce.hex()),
    ]
    lines += [(k, g.fmt_value(k, w[k]))
              for k in ["type", "flags", "dst_conn", "token", "psn", "path", "timestamp"]]
    lines += [("payload_len", str(len(plaintext))), ("plaintext", plaintext.hex()),
              ("aad", aad.hex()), ("ciphertext", ct.hex()), ("tag", tag.hex()),
              ("bytes", raw.hex())]
    files["early_write"] = g.render(
        "early_write",
        "early WRITE of the first flight: EARLY | PROTECTED | ACK_REQUEST, sealed with the early key",
        lines)
    return {n: text.replace("generate.py;", "generate_early.py;") for n, text in files.items()}


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "early")
    os.makedirs(here, exist_ok=True)
    return g.sync(here, all_files(), "early vector", "--check" in sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
