#!/usr/bin/env python3
"""Independent generator of the MetaRoCE packet-protection vectors (spec 5.3).

Writes every `*.vec` file in `protected/` next to this script: a handshake
(CONNECT and ACCEPT offering and choosing AES_256_GCM), the keys HKDF-SHA256
derives from a pre-shared key and the handshake transcript, and protected
packets of every type a protected connection sends, sealed with AES-256-GCM
in both directions; plus malformed protected packets and packets that parse
but must fail authentication. The cryptography is Python `cryptography`
(OpenSSL): HKDF and AESGCM; the headers come from `generate.py`'s `struct`
layouts. Nothing is shared with the Rust side (`core/src/crypto/`), so the
files are an oracle for it: `core/tests/protected_vectors.rs` derives,
seals, opens and parses against them.

Usage (from anywhere; needs `pip install cryptography`, the tests do not):

    python3 compliance/vectors/generate_protected.py          # rewrite
    python3 compliance/vectors/generate_protected.py --check  # exit 1 if stale

The file format is described in README.md next to this script.
"""

import hashlib
import hmac
import os
import struct
import sys
import zlib

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as g  # noqa: E402  (header layouts of spec 3)

FLAG_PROTECTED = 0x0008
SECURITY_LEN = 16
TAG_LEN = 16
INFO = b"MetaRoCE v2 AES-256-GCM"
OKM_LEN = 72

PSK = bytes.fromhex("000102030405060708090a0b0c0d0e0f"
                    "f0e1d2c3b4a5968778695a4b3c2d1e0f")
KEY_ID = 0x0000_0007

# The handshake (spec 3.8.1): the initiator offers AES_256_GCM with KEY_ID,
# the acceptor chooses it.
CONNECT = dict(type="CONNECT", flags=0, dst_conn=0, token=0, psn=0x1000_0001,
               path=0, timestamp=0x0000_1000, src_conn=0x0100_0001,
               src_token=0x1111_2222_3333_4444, mtu=1024, max_paths=4, window=256,
               reply_port=4795, timer_profile="Emulation", suite="Aes256Gcm",
               initial_psn=0x1000_0001, key_id=KEY_ID)
ACCEPT = dict(type="ACCEPT", flags=0, dst_conn=0x0100_0001,
              token=0x1111_2222_3333_4444, psn=0x2000_0002, path=0,
              timestamp=0x0000_2000, src_conn=0x0200_0002,
              src_token=0x5555_6666_7777_8888, mtu=1024, max_paths=4, window=256,
              reply_port=4795, timer_profile="Emulation", suite="Aes256Gcm",
              initial_psn=0x2000_0002, key_id=KEY_ID)


def keys():
    """Spec 5.3.3: PRK = HKDF-Extract(transcript, PSK); OKM = Expand(PRK, INFO, 72)."""
    transcript = g.extension(CONNECT)[:32] + g.extension(ACCEPT)[:32]
    okm = HKDF(algorithm=hashes.SHA256(), length=OKM_LEN, salt=transcript,
               info=INFO).derive(PSK)
    prk = hmac.new(transcript, PSK, hashlib.sha256).digest()
    return dict(transcript=transcript, prk=prk, okm=okm,
                i2a_key=okm[0:32], i2a_salt=okm[32:36],
                a2i_key=okm[36:68], a2i_salt=okm[68:72])


def header(f, payload_len):
    return struct.pack(">BBHIQIHHI", g.VERSION, g.TYPE_CODES[f["type"]], f["flags"],
                       f["dst_conn"], f["token"], f["psn"], f["path"], payload_len,
                       f["timestamp"])


def seal(f, k, direction, iv, plaintext):
    """A whole protected packet and its parts (spec 5.3.2, 5.3.4)."""
    key, salt = (k["i2a_key"], k["i2a_salt"]) if direction == "initiator_to_acceptor" \
        else (k["a2i_key"], k["a2i_salt"])
    security = struct.pack(">IIQ", KEY_ID, 0, iv)
    aad = header(f, len(plaintext)) + g.extension(f) + security
    nonce = salt + struct.pack(">Q", iv)
    sealed = AESGCM(key).encrypt(nonce, plaintext, aad)
    ciphertext, tag = sealed[:-TAG_LEN], sealed[-TAG_LEN:]
    body = aad + ciphertext + tag
    raw = body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    return dict(nonce=nonce, aad=aad, ciphertext=ciphertext, tag=tag, bytes=raw)


# Receivers' ids and tokens: the acceptor's (packets from the initiator) and
# the initiator's (packets from the acceptor).
TO_ACCEPTOR = dict(dst_conn=ACCEPT["src_conn"], token=ACCEPT["src_token"])
TO_INITIATOR = dict(dst_conn=CONNECT["src_conn"], token=CONNECT["src_token"])


def packets():
    """(name, description, direction, iv, fields, plaintext)"""
    i2a, a2i = "initiator_to_acceptor", "acceptor_to_initiator"
    p = FLAG_PROTECTED
    return [
        ("protected_write", "WRITE of 64 bytes, the initiator's first IV", i2a, 1,
         dict(type="WRITE", flags=p | 0x0001, psn=0x1000_0001, path=2,
              timestamp=0x0000_3000, msg_id=1, msg_offset=0, msg_len=64,
              key=0x00C0_FFEE, addr=0x0000_7F00_1234_0000, **TO_ACCEPTOR),
         g.pattern(64)),
        ("protected_write_4k", "WRITE of 4096 bytes, a retransmission with a new IV", i2a, 2,
         dict(type="WRITE", flags=p | 0x0003, psn=0x1000_0002, path=3,
              timestamp=0x0000_4000, msg_id=2, msg_offset=4096, msg_len=8192,
              key=0x00C0_FFEE, addr=0x0000_7F00_1234_1000, **TO_ACCEPTOR),
         g.pattern(4096, seed=3)),
        ("protected_send_imm", "SEND_IMM of 1000 bytes (not a multiple of 16)", i2a, 3,
         dict(type="SEND_IMM", flags=p, psn=0x1000_0003, path=0, timestamp=0x0000_5000,
              msg_id=3, msg_offset=0, msg_len=1000, recv_index=0, imm=0xDEAD_BEEF,
              **TO_ACCEPTOR),
         g.pattern(1000, seed=5)),
        ("protected_read_request", "READ_REQUEST: no payload, the tag covers the headers",
         i2a, 4,
         dict(type="READ_REQUEST", flags=p | 0x0001, psn=0x1000_0004, path=1,
              timestamp=0x0000_6000, msg_id=4, len=8192, source_key=0x0BAD_F00D,
              source_addr=0x0000_0000_1000_0000, sink_key=0x0C0F_FEE0,
              sink_addr=0x0000_7F00_2000_0000, **TO_ACCEPTOR),
         b""),
        ("protected_close", "CLOSE (NORMAL) with a large IV", i2a, 0x0000_0034_5678_9ABC,
         dict(type="CLOSE", flags=p, psn=0x1000_0005, path=0, timestamp=0x0000_7000,
              reason="Normal", **TO_ACCEPTOR),
         b""),
        ("protected_ack", "ACK with SACK bits, the acceptor's first IV", a2i, 1,
         dict(type="ACK", flags=p, psn=0x2000_0002, path=1, timestamp=0x0000_8000,
              cumulative=0x1000_0002, echo_psn=0x1000_0004, echo_timestamp=0x0000_6000,
              echo_path=1, path_rx_count=3, path_ce_count=1, rate_hint_mbps=1000,
              sack=[0, 1], **TO_INITIATOR),
         b""),
        ("protected_nak", "NAK (RECEIVER_NOT_READY)", a2i, 2,
         dict(type="NAK", flags=p, psn=0x2000_0002, path=0, timestamp=0x0000_9000,
              cumulative=0x1000_0002, nak_psn=0x1000_0003, reason="ReceiverNotReady",
              **TO_INITIATOR),
         b""),
        ("protected_read_response", "READ_RESPONSE of 17 bytes", a2i, 3,
         dict(type="READ_RESPONSE", flags=p | 0x0001, psn=0x2000_0002, path=3,
              timestamp=0x0000_A000, msg_id=4, msg_offset=0, msg_len=17,
              key=0x0C0F_FEE0, addr=0x0000_7F00_2000_0000, **TO_INITIATOR),
         g.pattern(17, seed=9)),
        ("protected_keepalive", "KEEPALIVE: the tag alone authenticates it", a2i, 4,
         dict(type="KEEPALIVE", flags=p, psn=0x2000_0003, path=0, timestamp=0x0000_B000,
              **TO_INITIATOR),
         b""),
    ]


COMMON = ["type", "flags", "dst_conn", "token", "psn", "path", "timestamp"]


def handshake_lines(k):
    return [
        ("psk", PSK.hex()),
        ("key_id", "0x%08x" % KEY_ID),
        ("connect", g.packet(CONNECT).hex()),
        ("accept", g.packet(ACCEPT).hex()),
        ("transcript", k["transcript"].hex()),
        ("info", INFO.hex()),
        ("prk", k["prk"].hex()),
        ("okm", k["okm"].hex()),
        ("i2a_key", k["i2a_key"].hex()),
        ("i2a_salt", k["i2a_salt"].hex()),
        ("a2i_key", k["a2i_key"].hex()),
        ("a2i_salt", k["a2i_salt"].hex()),
    ]


def render(name, desc, lines):
    return g.render(name, desc, lines).replace("generate.py;", "generate_protected.py;")


def all_files():
    k = keys()
    files = {}
    sealed_by_name = {}
    for name, desc, direction, iv, f, plaintext in packets():
        s = seal(f, k, direction, iv, plaintext)
        sealed_by_name[name] = s
        lines = handshake_lines(k) + [("direction", direction), ("iv", str(iv)),
                                      ("nonce", s["nonce"].hex())]
        lines += [(key, g.fmt_value(key, f[key])) for key in COMMON]
        lines += [("payload_len", str(len(plaintext))), ("plaintext", plaintext.hex()),
                  ("aad", s["aad"].hex()), ("ciphertext", s["ciphertext"].hex()),
                  ("tag", s["tag"].hex()), ("bytes", s["bytes"].hex())]
        files[name] = render(name, desc, lines)

    def tampered(name, desc, base, index, mask):
        raw = bytearray(sealed_by_name[base]["bytes"])
        raw[index] ^= mask
        raw = g.recrc(bytes(raw))
        lines = handshake_lines(k) + [("direction", "initiator_to_acceptor"),
                                      ("auth_error", "1"), ("bytes", raw.hex())]
        files[name] = render(name, desc, lines)

    # Parse fine, CRC right, must not authenticate (spec 5.3.5).
    tampered("tampered_ciphertext", "protected_write with one ciphertext bit flipped",
             "protected_write", 28 + 24 + 16 + 5, 0x01)
    tampered("tampered_header", "protected_write with its PSN changed",
             "protected_write", 19, 0x01)
    tampered("tampered_address", "protected_write with its Address changed",
             "protected_write", 28 + 21, 0x01)
    tampered("tampered_tag", "protected_read_request with a tag bit flipped",
             "protected_read_request", 28 + 32 + 16 + 3, 0x80)
    tampered("tampered_iv", "protected_close with another IV",
             "protected_close", 28 + 4 + 15, 0x02)

    def malformed(name, desc, raw, error):
        files[name] = render(name, desc, [("error", error), ("bytes", raw.hex())])

    write = sealed_by_name["protected_write"]["bytes"]
    ext_end = 28 + 24
    # Reserved bytes of the security extension set (after the CRC check).
    raw = bytearray(write)
    raw[ext_end + 7] = 1
    malformed("protected_reserved", "security extension Reserved nonzero",
              g.recrc(bytes(raw)), "Reserved")
    raw = bytearray(write)
    raw[ext_end:ext_end + 4] = b"\0\0\0\0"
    malformed("protected_key_id_zero", "security extension Key ID 0",
              g.recrc(bytes(raw)), "BadField")
    # PROTECTED on a CONNECT: the length accounts for extension and tag,
    # the CRC is right, the flag is not allowed on the type.
    connect = g.packet(dict(CONNECT, flags=FLAG_PROTECTED))
    raw = connect[:-4] + bytes(SECURITY_LEN + TAG_LEN) + b"\0\0\0\0"
    malformed("protected_connect", "PROTECTED flag on a CONNECT", g.recrc(raw), "Reserved")
    # The tag cut off: shorter than the header says.
    malformed("protected_truncated", "protected_write without its tag",
              g.recrc(write[:-(TAG_LEN + 4)] + b"\0\0\0\0"), "Truncated")
    # A protected packet's lengths without the PROTECTED flag: too long.
    raw = bytearray(write)
    raw[3] &= ~FLAG_PROTECTED & 0xFF
    malformed("protected_flag_cleared", "protected_write with PROTECTED cleared",
              g.recrc(bytes(raw)), "BadLength")
    return files


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "protected")
    os.makedirs(here, exist_ok=True)
    return g.sync(here, all_files(), "protected vector", "--check" in sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
