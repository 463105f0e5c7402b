#!/usr/bin/env python3
"""Independent generator of the MetaRoCE golden vectors.

This script writes every `*.vec` file in this folder from the wire layout of
spec section 3 (mirrored in `core/src/wire/packet.rs` field tables), using
only `struct` (big-endian packing) and `zlib.crc32` (IEEE CRC-32, the same
polynomial, reflection and final XOR as the Rust side's `crc32fast`). It
shares no code with the Rust emitter, so the files are an oracle for it: the
tests in `core/tests/golden.rs` parse these bytes and re-emit them from the
decoded fields, and both directions must agree byte for byte.

Usage (from anywhere):

    python3 compliance/vectors/generate.py          # rewrite the files
    python3 compliance/vectors/generate.py --check  # exit 1 if any file differs

The file format is described in README.md next to this script.
"""

import ipaddress
import os
import struct
import sys
import zlib

VERSION = 2
HEADER_LEN = 28
CRC_LEN = 4
DEFAULT_UDP_PORT = 4795

TYPE_CODES = {
    "WRITE": 0x01,
    "WRITE_IMM": 0x02,
    "SEND": 0x03,
    "SEND_IMM": 0x04,
    "READ_REQUEST": 0x05,
    "READ_RESPONSE": 0x06,
    "ACK": 0x10,
    "NAK": 0x11,
    "CONNECT": 0x20,
    "ACCEPT": 0x21,
    "CLOSE": 0x22,
    "KEEPALIVE": 0x23,
    "RETRY": 0x24,
    "NEW_TOKEN": 0x25,
}

TIMER_PROFILES = {"DataCenter": 0, "Emulation": 1}
SUITES = {"None": 0, "Aes256Gcm": 1}

NAK_REASONS = {
    "InvalidKey": 1,
    "AccessDenied": 2,
    "OutOfBounds": 3,
    "ProtocolError": 4,
    "ReceiverNotReady": 5,
    "ReceiveTooSmall": 6,
}

CLOSE_REASONS = {"Normal": 0, "Error": 1, "IdleTimeout": 2, "Rejected": 3, "Reclaimed": 4}

FLAG_ACK_REQUEST = 0x0001
FLAG_RETRANSMISSION = 0x0002
FLAG_CLOSE_REPLY = 0x0004
FLAG_EARLY = 0x0010

ECN_NAMES = {0b00: "NOT_ECT", 0b01: "ECT1", 0b10: "ECT0", 0b11: "CE"}

# Keys written in hex at their field's full width (identifiers, keys,
# addresses, timestamps, bit fields); every other integer is written in
# decimal. Readers accept both forms.
HEX_WIDTHS = {
    "type_code": 2, "flags": 4, "dst_conn": 8, "token": 16, "timestamp": 8,
    "key": 8, "addr": 16, "imm": 8, "source_key": 8, "source_addr": 16,
    "sink_key": 8, "sink_addr": 16, "echo_timestamp": 8, "src_conn": 8,
    "src_token": 16, "key_id": 8,
}


# --------------------------------------------------------------------------
# MetaRoCE packet layout (spec 3.2 - 3.9)
# --------------------------------------------------------------------------

def sack_bytes(bits):
    """Spec 3.6: bit i is byte i // 8, mask 0x80 >> (i % 8)."""
    out = bytearray(32)
    for i in bits:
        assert 0 <= i < 256
        out[i // 8] |= 0x80 >> (i % 8)
    return bytes(out)


def extension(f):
    """Extension header bytes for the packet type in `f`."""
    t = f["type"]
    if t in ("WRITE", "WRITE_IMM", "READ_RESPONSE"):
        ext = struct.pack(">IIIIQ", f["msg_id"], f["msg_offset"], f["msg_len"],
                          f["key"], f["addr"])
        if t == "WRITE_IMM":
            ext += struct.pack(">II", f["imm"], f["recv_index"])
        return ext
    if t in ("SEND", "SEND_IMM"):
        ext = struct.pack(">IIII", f["msg_id"], f["msg_offset"], f["msg_len"],
                          f["recv_index"])
        if t == "SEND_IMM":
            ext += struct.pack(">I", f["imm"])
        return ext
    if t == "READ_REQUEST":
        return struct.pack(">IIIQIQ", f["msg_id"], f["len"], f["source_key"],
                           f["source_addr"], f["sink_key"], f["sink_addr"])
    if t == "ACK":
        return struct.pack(">IIIHHHHI", f["cumulative"], f["echo_psn"], f["echo_timestamp"],
                           f["echo_path"], f["path_rx_count"],
                           f["path_ce_count"], f.get("sack_offset", 0),
                           f["rate_hint_mbps"]) + sack_bytes(f["sack"])
    if t == "NAK":
        reserved = f.get("_nak_reserved", b"\0\0\0")
        return struct.pack(">IIB", f["cumulative"], f["nak_psn"],
                           f.get("_reason_code", NAK_REASONS.get(f.get("reason"), 0))) + reserved
    if t in ("CONNECT", "ACCEPT"):
        # Spec 3.8.1: 64 bytes. An ACCEPT's Cookie field holds its Rate
        # Grant (Mbit/s) in its first 4 bytes and zeros after them.
        cookie = f.get("cookie", bytes(32))
        if t == "ACCEPT" and "rate_grant_mbps" in f:
            assert cookie == struct.pack(">I", f["rate_grant_mbps"]) + bytes(28)
        assert len(cookie) == 32
        return struct.pack(">IQHHIHBBII", f["src_conn"], f["src_token"], f["mtu"],
                           f["max_paths"], f["window"], f["reply_port"],
                           f.get("_profile_code", TIMER_PROFILES[f.get("timer_profile", "DataCenter")]),
                           f.get("_suite_code", SUITES[f.get("suite", "None")]),
                           f["initial_psn"], f.get("key_id", 0)) + cookie
    if t == "RETRY":
        # Spec 3.8.4: the cookie alone.
        assert len(f["cookie"]) == 32
        return f["cookie"]
    if t == "NEW_TOKEN":
        # Spec 3.8.5: the address token alone, never all zero.
        assert len(f["address_token"]) == 32
        assert any(f["address_token"]) or f.get("_allow_zero_token")
        return f["address_token"]
    if t == "CLOSE":
        reserved = f.get("_close_reserved", b"\0\0\0")
        return struct.pack(">B", f.get("_reason_code", CLOSE_REASONS.get(f.get("reason"), 0))) + reserved
    if t == "KEEPALIVE":
        return b""
    raise ValueError(t)


def packet(f):
    """Whole MetaRoCE packet: common header, extension, payload, CRC-32."""
    payload = f.get("payload", b"")
    type_code = f.get("_type_code", TYPE_CODES.get(f["type"]))
    header = struct.pack(
        ">BBHIQIHHI",
        f.get("_version", VERSION),
        type_code,
        f["flags"],
        f["dst_conn"],
        f["token"],
        f["psn"],
        f["path"],
        f.get("_payload_len", len(payload)),
        f["timestamp"],
    )
    assert len(header) == HEADER_LEN
    body = header + extension(f) + payload
    return body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def recrc(raw):
    """Replace the trailer of `raw` with the CRC of everything before it."""
    body = raw[:-CRC_LEN]
    return body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


# --------------------------------------------------------------------------
# Ethernet / IPv4 or IPv6 / UDP (spec 3.1; RFC 791, 8200, 768, 3168)
# --------------------------------------------------------------------------

def mac_bytes(text):
    return bytes(int(x, 16) for x in text.split(":"))


def ones_complement_sum(data):
    if len(data) % 2:
        data += b"\0"
    s = 0
    for (w,) in struct.iter_unpack(">H", data):
        s += w
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def checksum(data):
    return (~ones_complement_sum(data)) & 0xFFFF


def udp_datagram(pseudo, sport, dport, transport):
    length = 8 + len(transport)
    head = struct.pack(">HHHH", sport, dport, length, 0)
    c = checksum(pseudo + head + transport)
    # RFC 768: a computed checksum of zero is sent as all ones.
    if c == 0:
        c = 0xFFFF
    return struct.pack(">HHHH", sport, dport, length, c) + transport


def frame(e, transport):
    """Ethernet frame around `transport`, as described by the encap dict `e`."""
    tos = ((e["dscp"] & 0x3F) << 2) | (e["ecn"] & 0b11)
    src = ipaddress.ip_address(e["ip_src"])
    dst = ipaddress.ip_address(e["ip_dst"])
    udp_len = 8 + len(transport)
    if e["ip_version"] == 4:
        ethertype = 0x0800
        pseudo = src.packed + dst.packed + struct.pack(">BBH", 0, 17, udp_len)
        udp = udp_datagram(pseudo, e["udp_src_port"], e["udp_dst_port"], transport)
        # Version 4, IHL 5; identification 0; DF set, no fragmentation.
        hdr = struct.pack(">BBHHHBBH4s4s", 0x45, tos, 20 + udp_len, 0, 0x4000,
                          e["hop_limit"], 17, 0, src.packed, dst.packed)
        hdr = hdr[:10] + struct.pack(">H", checksum(hdr)) + hdr[12:]
        ip = hdr + udp
    else:
        ethertype = 0x86DD
        pseudo = src.packed + dst.packed + struct.pack(">IBBBB", udp_len, 0, 0, 0, 17)
        udp = udp_datagram(pseudo, e["udp_src_port"], e["udp_dst_port"], transport)
        # Version 6, traffic class, flow label 0.
        vtf = (6 << 28) | (tos << 20)
        ip = struct.pack(">IHBB16s16s", vtf, udp_len, 17, e["hop_limit"],
                         src.packed, dst.packed) + udp
    eth = mac_bytes(e["eth_dst"]) + mac_bytes(e["eth_src"]) + struct.pack(">H", ethertype)
    return eth + ip


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------

def hdr(flags=0, dst_conn=0x0A0B0C0D, token=0x0123456789ABCDEF, psn=1000,
        path=3, timestamp=0x11223344):
    return dict(flags=flags, dst_conn=dst_conn, token=token, psn=psn, path=path,
                timestamp=timestamp)


def pattern(n, seed=0):
    return bytes((seed + 7 * i) & 0xFF for i in range(n))


V4_ENCAP = dict(eth_src="02:00:00:00:00:01", eth_dst="02:00:00:00:00:02",
                ip_version=4, ip_src="10.0.0.1", ip_dst="10.0.0.2",
                udp_src_port=49152, udp_dst_port=DEFAULT_UDP_PORT, dscp=26,
                ecn=0b10, hop_limit=64)
V6_ENCAP = dict(eth_src="02:00:00:00:00:02", eth_dst="02:00:00:00:00:01",
                ip_version=6, ip_src="fd00::2", ip_dst="fd00::1",
                udp_src_port=61234, udp_dst_port=DEFAULT_UDP_PORT, dscp=0,
                ecn=0b00, hop_limit=255)


def valid_cases():
    """(name, description, fields, encap or None)"""
    c = []

    def add(name, desc, fields, encap=None):
        # Spec 3.2.4: CONNECT and ACCEPT carry their Initial PSN in the PSN
        # field, RETRY carries 0.
        if fields["type"] in ("CONNECT", "ACCEPT"):
            assert fields["psn"] == fields["initial_psn"], name
        if fields["type"] == "RETRY":
            assert fields["psn"] == 0, name
        c.append((name, desc, fields, encap))

    # WRITE (spec 3.4.1)
    add("write_basic", "first packet of a 4 KiB WRITE, 64 payload bytes",
        dict(type="WRITE", **hdr(), msg_id=7, msg_offset=0, msg_len=4096,
             key=0x00C0FFEE, addr=0x00007F0012340000, payload=pattern(64)),
        V4_ENCAP)
    add("write_last_retransmitted", "last packet of a WRITE, ACK_REQUEST | RETRANSMISSION",
        dict(type="WRITE", **hdr(flags=FLAG_ACK_REQUEST | FLAG_RETRANSMISSION, psn=0xFFFFFFFF,
                                path=0, timestamp=0),
             msg_id=0xFFFFFFFF, msg_offset=4000, msg_len=4096, key=0xFFFFFFFF,
             addr=0xFFFFFFFFFFFFFFFF - 95, payload=pattern(96, 3)))
    add("write_zero_length", "zero-length WRITE: empty payload, message length 0",
        dict(type="WRITE", **hdr(flags=FLAG_ACK_REQUEST), msg_id=1, msg_offset=0, msg_len=0,
             key=1, addr=0, payload=b""))
    add("write_early", "early WRITE (EARLY | ACK_REQUEST): addressed with the sender's own "
        "id and token (spec 4.2.4; sent protected, here the header alone)",
        dict(type="WRITE", **hdr(flags=FLAG_EARLY | FLAG_ACK_REQUEST, dst_conn=0x01020304,
                                token=0x1122334455667788, psn=0x0000004D, path=2),
             msg_id=0, msg_offset=0, msg_len=64, key=0x00C0FFEE, addr=0x00007F0012340000,
             payload=pattern(64, 5)))
    # WRITE_IMM
    add("write_imm", "single-packet WRITE_IMM carrying immediate data",
        dict(type="WRITE_IMM", **hdr(flags=FLAG_ACK_REQUEST), msg_id=8, msg_offset=0,
             msg_len=32, key=0x1234, addr=0x1000, imm=0xDEADBEEF, recv_index=3,
             payload=pattern(32, 9)))
    add("write_imm_middle", "middle packet of a WRITE_IMM (every packet carries imm)",
        dict(type="WRITE_IMM", **hdr(psn=5), msg_id=9, msg_offset=256, msg_len=1024,
             key=0xABCD0001, addr=0x2000100, imm=0, recv_index=0xFFFFFFFF,
             payload=pattern(256, 1)))
    # SEND (spec 3.4.2)
    add("send_basic", "SEND into the 3rd posted receive",
        dict(type="SEND", **hdr(), msg_id=12, msg_offset=0, msg_len=100, recv_index=2,
             payload=pattern(100, 5)),
        dict(V6_ENCAP, ecn=0b10, dscp=46))
    add("send_tail", "last packet of a SEND at a large offset",
        dict(type="SEND", **hdr(flags=FLAG_ACK_REQUEST, path=255), msg_id=13,
             msg_offset=0xFFFFFFF0, msg_len=0xFFFFFFFF, recv_index=0xFFFFFFFF,
             payload=pattern(15, 11)))
    # SEND_IMM
    add("send_imm", "SEND_IMM with immediate data",
        dict(type="SEND_IMM", **hdr(flags=FLAG_ACK_REQUEST), msg_id=14, msg_offset=0,
             msg_len=8, recv_index=0, imm=0x01020304, payload=b"metaroce"))
    add("send_imm_empty", "zero-length SEND_IMM (immediate only)",
        dict(type="SEND_IMM", **hdr(flags=FLAG_RETRANSMISSION), msg_id=15, msg_offset=0,
             msg_len=0, recv_index=4, imm=0xFFFFFFFF, payload=b""))
    # READ_REQUEST (spec 3.4.3)
    add("read_request", "READ of 1 MiB from the responder into the requester",
        dict(type="READ_REQUEST", **hdr(flags=FLAG_ACK_REQUEST), msg_id=20, len=1 << 20,
             source_key=0x5000, source_addr=0x7F0000000000,
             sink_key=0x6000, sink_addr=0x550000001000),
        dict(V4_ENCAP, ecn=0b11))
    add("read_request_retransmitted", "retransmitted zero-length READ_REQUEST",
        dict(type="READ_REQUEST", **hdr(flags=FLAG_RETRANSMISSION, psn=0), msg_id=0, len=0,
             source_key=0xFFFFFFFF, source_addr=0xFFFFFFFFFFFFFFFF,
             sink_key=0, sink_addr=0))
    # READ_RESPONSE (spec 3.4.4)
    add("read_response", "first READ_RESPONSE packet, MTU-sized payload",
        dict(type="READ_RESPONSE", **hdr(), msg_id=20, msg_offset=0, msg_len=1 << 20,
             key=0x6000, addr=0x550000001000, payload=pattern(1024, 2)))
    add("read_response_last", "last READ_RESPONSE packet, ACK_REQUEST",
        dict(type="READ_RESPONSE", **hdr(flags=FLAG_ACK_REQUEST), msg_id=21,
             msg_offset=1000, msg_len=1003, key=0x6001, addr=0x550000001000 + 1000,
             payload=b"end"))
    # ACK (spec 3.5, 3.6)
    ack = dict(type="ACK", cumulative=1001, echo_psn=1003, echo_timestamp=0x11223344, echo_path=3,
               path_rx_count=500, path_ce_count=17, rate_hint_mbps=25000, sack_offset=0)
    add("ack_sparse_sack", "ACK with SACK bits 0, 9, 255 (first, second byte, last)",
        dict(ack, **hdr(psn=0), sack=[0, 9, 255]),
        dict(V6_ENCAP))
    add("ack_empty_sack", "in-order ACK: no SACK bits, no rate hint",
        dict(ack, **hdr(psn=0), sack=[], rate_hint_mbps=0, path_ce_count=0))
    add("ack_full_sack", "ACK with all 256 SACK bits set, counters wrapped to 65535",
        dict(ack, **hdr(psn=0), sack=list(range(256)), path_rx_count=0xFFFF,
             path_ce_count=0xFFFF, rate_hint_mbps=0xFFFFFFFF, cumulative=0xFFFFFFFF,
             echo_psn=0xFFFFFFFF))
    add("ack_word_edges", "ACK with SACK bits at 64-bit word and byte edges",
        dict(ack, **hdr(psn=0), sack=[1, 7, 8, 63, 64, 127, 128, 191, 192, 254]))
    # SACK Offset (spec 3.5, 3.6): a window above 256 PSNs, the block at
    # the newest arrivals, far beyond the cumulative PSN.
    add("ack_sack_offset", "ACK whose SACK block starts 5000 PSNs after C + 1 "
        "(bits for PSNs 6002, 6003, 6257)",
        dict(ack, **hdr(psn=0), sack_offset=5000, echo_psn=6257, sack=[0, 1, 255]))
    add("ack_sack_offset_max", "ACK with the largest SACK Offset (65535), PSNs wrapping "
        "through zero",
        dict(ack, **hdr(psn=0), cumulative=0xFFFFFF00, sack_offset=0xFFFF, echo_psn=0x0000FF00,
             sack=[0, 64, 200]))
    # NAK (spec 3.7): every reason code
    for i, (reason, code) in enumerate(NAK_REASONS.items()):
        add("nak_" + reason_snake(reason), "NAK " + reason + " (code %d)" % code,
            dict(type="NAK", **hdr(psn=0), cumulative=2000 + i, nak_psn=2001 + i, reason=reason))
    # CONNECT / ACCEPT (spec 3.8.1)
    add("connect_min", "CONNECT with the smallest parameters (MTU 256, 1 path, window 1)",
        dict(type="CONNECT", **hdr(dst_conn=0, token=0, psn=0, path=0), src_conn=1,
             src_token=1, mtu=256, max_paths=1, window=1, reply_port=0, initial_psn=0,
             timer_profile="DataCenter", suite="None", key_id=0, cookie=bytes(32)),
        dict(V4_ENCAP, ecn=0b00, dscp=48))
    add("connect_max", "CONNECT with the largest parameters (MTU 9000, 256 paths, window 65536)",
        dict(type="CONNECT", **hdr(dst_conn=0, token=0, psn=0xFFFFFFFF, path=0), src_conn=0xFFFFFFFF,
             src_token=0xFFFFFFFFFFFFFFFF, mtu=9000, max_paths=256, window=65536,
             reply_port=0xFFFF, initial_psn=0xFFFFFFFF, timer_profile="Emulation",
             suite="Aes256Gcm", key_id=0xFFFFFFFF, cookie=bytes(range(0xE0, 0x100))))
    add("connect_with_cookie", "CONNECT repeated with the cookie of a RETRY",
        dict(type="CONNECT", **hdr(dst_conn=0, token=0, psn=0x00ABCDEF, path=3, timestamp=0x01020304),
             src_conn=0x00001234, src_token=0x1122334455667788, mtu=1024, max_paths=4,
             window=256, reply_port=4795, initial_psn=0x00ABCDEF,
             timer_profile="Emulation", suite="None", key_id=0,
             cookie=bytes(range(0x10, 0x30))))
    # 0-RTT (spec 4.2.4): EARLY on CONNECT, the Cookie field an early proof
    # (computed step by step in early/, generate_early.py).
    add("connect_early", "CONNECT with EARLY: the Cookie field carries an early proof "
        "(Time, 8 zero bytes, Tag)",
        dict(type="CONNECT", **hdr(flags=FLAG_EARLY, dst_conn=0, token=0, psn=0x0000004D,
                                   path=16, timestamp=0x00001000),
             src_conn=0x01020304, src_token=0x1122334455667788, mtu=4096, max_paths=16,
             window=256, reply_port=4795, initial_psn=0x0000004D,
             timer_profile="DataCenter", suite="Aes256Gcm", key_id=1,
             cookie=bytes.fromhex("18ed6e06645e4d150000000000000000"
                                  "93df6f9414b5c6585193fc2e53bd517a")))
    add("connect_read_depth", "CONNECT stating a READ Depth of 16 in its Path ID field "
        "(spec 3.8.1: the READs its sender serves at once; 0 = not stated)",
        dict(type="CONNECT", **hdr(dst_conn=0, token=0, psn=0x00012345, path=16),
             src_conn=0x00005678, src_token=0x5566778899AABBCC, mtu=1024, max_paths=4,
             window=4096, reply_port=0, initial_psn=0x00012345,
             timer_profile="Emulation", suite="None", key_id=0, cookie=bytes(32)))
    add("accept_read_depth_max", "ACCEPT stating the largest READ Depth (65535) in its "
        "Path ID field (spec 3.8.1)",
        dict(type="ACCEPT", **hdr(dst_conn=0x00005678, token=0x5566778899AABBCC, psn=0x00FEDCBA,
                                  path=0xFFFF),
             src_conn=0x0000009D, src_token=0x5152535455565758, mtu=1024, max_paths=4,
             window=4096, reply_port=0, initial_psn=0x00FEDCBA,
             timer_profile="Emulation", suite="None", key_id=0, cookie=bytes(32)))
    add("accept", "ACCEPT answering a CONNECT with negotiated values",
        dict(type="ACCEPT", **hdr(dst_conn=0x00000042, token=0x8877665544332211, psn=0x10000000,
                                  path=0),
             src_conn=0x00000099, src_token=0x0F1E2D3C4B5A6978, mtu=4096, max_paths=8,
             window=128, reply_port=4795, initial_psn=0x10000000,
             timer_profile="DataCenter", suite="Aes256Gcm", key_id=0x00000007,
             cookie=bytes(32)))
    add("accept_window_above_256", "ACCEPT negotiating a long-haul window of 30000 PSNs "
        "(spec 4.4: beyond one SACK bitvector)",
        dict(type="ACCEPT", **hdr(dst_conn=0x00000043, token=0x1122334455667788, psn=0x7FFFFFF0,
                                  path=0),
             src_conn=0x0000009A, src_token=0x0102030405060708, mtu=4096, max_paths=16,
             window=30000, reply_port=4795, initial_psn=0x7FFFFFF0,
             timer_profile="DataCenter", suite="None", key_id=0, cookie=bytes(32)))
    add("accept_rate_grant", "ACCEPT granting the initiator 1/63 of a 100 Gbit/s link "
        "(spec 3.8.1, 4.10.6: Rate Grant in the Cookie field's first 4 bytes)",
        dict(type="ACCEPT", **hdr(dst_conn=0x00000044, token=0x0A0B0C0D0E0F1011, psn=0x00C0FFEE,
                                  path=0),
             src_conn=0x0000009B, src_token=0x2122232425262728, mtu=4096, max_paths=16,
             window=256, reply_port=4795, initial_psn=0x00C0FFEE,
             timer_profile="DataCenter", suite="None", key_id=0, rate_grant_mbps=1587,
             cookie=struct.pack(">I", 1587) + bytes(28)))
    add("accept_rate_grant_max", "ACCEPT with the largest Rate Grant (0xFFFFFFFF Mbit/s)",
        dict(type="ACCEPT", **hdr(dst_conn=0x00000045, token=0x3132333435363738, psn=0,
                                  path=0),
             src_conn=0x0000009C, src_token=0x4142434445464748, mtu=4096, max_paths=16,
             window=256, reply_port=0, initial_psn=0,
             timer_profile="DataCenter", suite="None", key_id=0, rate_grant_mbps=0xFFFFFFFF,
             cookie=b"\xff" * 4 + bytes(28)))
    # RETRY (spec 3.8.4)
    add("retry", "RETRY carrying a cookie, addressed by the initiator's id and token",
        dict(type="RETRY", **hdr(dst_conn=0x00001234, token=0x1122334455667788, psn=0,
                                 path=3),
             cookie=bytes(range(0x10, 0x30))),
        dict(V4_ENCAP, ecn=0b00, dscp=0))
    # NEW_TOKEN (spec 3.8.5)
    add("new_token", "NEW_TOKEN: an address token for the initiator's next CONNECTs",
        dict(type="NEW_TOKEN", **hdr(dst_conn=0x00001234, token=0x1122334455667788, psn=77,
                                     path=0),
             address_token=bytes.fromhex("0000000502000000000000000000000000")[:16]
             + bytes(range(0x40, 0x50))),
        dict(V4_ENCAP, ecn=0b00, dscp=0))
    # CLOSE (spec 3.8.2)
    add("close_normal", "CLOSE, reason Normal",
        dict(type="CLOSE", **hdr(psn=0), reason="Normal"))
    add("close_reply", "CLOSE answering a CLOSE (CLOSE_REPLY flag)",
        dict(type="CLOSE", **hdr(flags=FLAG_CLOSE_REPLY, psn=0), reason="Normal"),
        dict(V6_ENCAP, ecn=0b01, dscp=10))
    add("close_error", "CLOSE, reason Error",
        dict(type="CLOSE", **hdr(psn=0), reason="Error"))
    add("close_idle_timeout", "CLOSE, reason IdleTimeout",
        dict(type="CLOSE", **hdr(psn=0), reason="IdleTimeout"))
    add("close_rejected", "CLOSE refusing a CONNECT, reason Rejected",
        dict(type="CLOSE", **hdr(flags=FLAG_CLOSE_REPLY, psn=0), reason="Rejected"))
    add("close_reclaimed", "CLOSE of a connection whose slot was reclaimed, reason Reclaimed",
        dict(type="CLOSE", **hdr(psn=0), reason="Reclaimed"))
    # KEEPALIVE
    add("keepalive", "KEEPALIVE",
        dict(type="KEEPALIVE", **hdr(psn=0)))
    add("keepalive_max_fields", "KEEPALIVE with every header field at its maximum",
        dict(type="KEEPALIVE", **hdr(dst_conn=0xFFFFFFFF, token=0xFFFFFFFFFFFFFFFF,
                                     psn=0xFFFFFFFF, path=0xFFFF, timestamp=0xFFFFFFFF)))
    return c


def reason_snake(name):
    out = ""
    for ch in name:
        if ch.isupper() and out:
            out += "_"
        out += ch.lower()
    return out


def malformed_cases():
    """(name, description, raw bytes, expected error)"""
    c = []
    base_write = dict(type="WRITE", **hdr(), msg_id=7, msg_offset=0, msg_len=4096,
                      key=0x00C0FFEE, addr=0x1000, payload=pattern(16))
    write = packet(base_write)
    ack = packet(dict(type="ACK", **hdr(psn=0), cumulative=5, echo_psn=5, echo_timestamp=1, echo_path=0,
                      path_rx_count=1, path_ce_count=0, rate_hint_mbps=0, sack=[0]))
    conn = dict(type="CONNECT", **hdr(dst_conn=0, token=0, psn=0, path=0), src_conn=5,
                src_token=6, mtu=1500, max_paths=4, window=64, reply_port=50000,
                initial_psn=0)
    retry = dict(type="RETRY", **hdr(psn=0), cookie=bytes(32))

    def add(name, desc, raw, error):
        c.append((name, desc, raw, error))

    def flip(raw, index, mask):
        b = bytearray(raw)
        b[index] ^= mask
        return bytes(b)

    # Truncated
    add("err_truncated_short", "31 bytes: shorter than header + CRC", write[:31], "Truncated")
    add("err_truncated_one_byte", "a single byte", write[:1], "Truncated")
    add("err_truncated_last_byte", "WRITE missing the last CRC byte", write[:-1], "Truncated")
    add("err_truncated_extension", "ACK cut inside its extension header", ack[:50], "Truncated")
    add("err_truncated_payload_len", "payload_len claims more than the buffer holds",
        packet(dict(base_write, _payload_len=17)), "Truncated")
    # BadVersion / UnknownType
    add("err_bad_version_0", "version 0", recrc(flip(write, 0, 0x02)), "BadVersion(0)")
    add("err_bad_version_1", "version 1 (before the RETRY handshake)",
        packet(dict(base_write, _version=1)), "BadVersion(1)")
    add("err_bad_version_3", "version 3", packet(dict(base_write, _version=3)), "BadVersion(3)")
    add("err_unknown_type_0", "type 0x00", packet(dict(base_write, _type_code=0x00)),
        "UnknownType(0)")
    add("err_unknown_type_7", "type 0x07 (after READ_RESPONSE)",
        packet(dict(base_write, _type_code=0x07)), "UnknownType(7)")
    add("err_unknown_type_ff", "type 0xff", packet(dict(base_write, _type_code=0xFF)),
        "UnknownType(255)")
    # BadCrc
    add("err_bad_crc_trailer", "WRITE with the last CRC bit flipped",
        flip(write, len(write) - 1, 0x01), "BadCrc")
    add("err_bad_crc_payload", "WRITE with one payload bit flipped", flip(write, 60, 0x80),
        "BadCrc")
    add("err_bad_crc_header", "ACK with one PSN bit flipped", flip(ack, 19, 0x04), "BadCrc")
    add("err_bad_crc_zero", "KEEPALIVE with an all-zero trailer",
        packet(dict(type="KEEPALIVE", **hdr()))[:-4] + b"\0\0\0\0", "BadCrc")
    # BadLength
    add("err_trailing_byte", "WRITE followed by one extra byte", write + b"\0", "BadLength")
    add("err_payload_on_ack", "ACK with payload_len 4 and 4 payload bytes",
        packet(dict(type="ACK", **hdr(psn=0), cumulative=5, echo_psn=5, echo_timestamp=1, echo_path=0,
                    path_rx_count=1, path_ce_count=0, rate_hint_mbps=0, sack=[],
                    payload=b"abcd")), "BadLength")
    add("err_payload_on_keepalive", "KEEPALIVE with a 1-byte payload",
        packet(dict(type="KEEPALIVE", **hdr(), payload=b"x")), "BadLength")
    # Reserved
    add("err_reserved_flag", "WRITE with undefined flag bit 0x8000",
        packet(dict(base_write, flags=0x8000)), "Reserved")
    add("err_close_reply_on_write", "WRITE with CLOSE_REPLY", packet(dict(base_write, flags=4)),
        "Reserved")
    add("err_ack_request_on_ack", "ACK with ACK_REQUEST",
        recrc(flip(ack, 3, 0x01)), "Reserved")
    add("err_retransmission_on_close", "CLOSE with RETRANSMISSION",
        packet(dict(type="CLOSE", **hdr(flags=FLAG_RETRANSMISSION), reason="Normal")),
        "Reserved")
    add("err_early_on_ack", "ACK with EARLY (allowed on CONNECT and reliable types only)",
        recrc(flip(ack, 3, FLAG_EARLY)), "Reserved")
    add("err_early_on_accept", "ACCEPT with EARLY",
        packet(dict(type="ACCEPT", **hdr(flags=FLAG_EARLY), src_conn=2, src_token=2, mtu=1024,
                    max_paths=4, window=256, reply_port=4795, initial_psn=1000,
                    timer_profile="DataCenter", suite="None", key_id=0)), "Reserved")
    add("err_early_on_close", "CLOSE with EARLY",
        packet(dict(type="CLOSE", **hdr(flags=FLAG_EARLY), reason="Normal")), "Reserved")
    add("err_flag_on_keepalive", "KEEPALIVE with ACK_REQUEST",
        packet(dict(type="KEEPALIVE", **hdr(flags=FLAG_ACK_REQUEST))), "Reserved")
    add("err_nak_reserved", "NAK with a reserved byte nonzero",
        packet(dict(type="NAK", **hdr(), cumulative=1, nak_psn=1, reason="InvalidKey",
                    _nak_reserved=b"\0\0\x01")), "Reserved")
    add("err_close_reserved", "CLOSE with a reserved byte nonzero",
        packet(dict(type="CLOSE", **hdr(), reason="Normal", _close_reserved=b"\x80\0\0")),
        "Reserved")
    add("err_connect_dst_conn", "CONNECT addressed to a connection id",
        packet(dict(conn, dst_conn=1)), "Reserved")
    add("err_connect_token", "CONNECT carrying a token",
        packet(dict(conn, token=1)), "Reserved")
    # BadField
    add("err_nak_reason_0", "NAK reason code 0", packet(dict(type="NAK", **hdr(), cumulative=1,
                                                             nak_psn=1, _reason_code=0)),
        "BadField")
    add("err_nak_reason_7", "NAK reason code 7", packet(dict(type="NAK", **hdr(), cumulative=1,
                                                             nak_psn=1, _reason_code=7)),
        "BadField")
    add("err_close_reason_5", "CLOSE reason code 5",
        packet(dict(type="CLOSE", **hdr(), _reason_code=5)), "BadField")
    add("err_connect_mtu_low", "CONNECT MTU 255", packet(dict(conn, mtu=255)), "BadField")
    add("err_connect_mtu_high", "CONNECT MTU 9001", packet(dict(conn, mtu=9001)), "BadField")
    add("err_connect_paths_zero", "CONNECT with 0 paths", packet(dict(conn, max_paths=0)),
        "BadField")
    add("err_connect_paths_257", "CONNECT with 257 paths", packet(dict(conn, max_paths=257)),
        "BadField")
    add("err_connect_window_zero", "CONNECT with window 0", packet(dict(conn, window=0)),
        "BadField")
    add("err_connect_window_65537", "CONNECT with window 65537",
        packet(dict(conn, window=65537)), "BadField")
    add("err_connect_profile_2", "CONNECT with timer profile 2",
        packet(dict(conn, _profile_code=2)), "BadField")
    add("err_connect_suite_2", "CONNECT with suite 2", packet(dict(conn, _suite_code=2)),
        "BadField")
    add("err_connect_suite_without_key", "CONNECT offering AES-256-GCM with key id 0",
        packet(dict(conn, suite="Aes256Gcm", key_id=0)), "BadField")
    add("err_connect_key_without_suite", "CONNECT with a key id and no suite",
        packet(dict(conn, key_id=9)), "BadField")
    add("err_accept_cookie", "ACCEPT with a nonzero cookie byte",
        packet(dict(conn, type="ACCEPT", dst_conn=5, token=6, cookie=bytes(31) + b"\x01")),
        "Reserved")
    add("err_retry_payload", "RETRY with a 1-byte payload",
        packet(dict(retry, payload=b"x")), "BadLength")
    add("err_retry_flag", "RETRY with ACK_REQUEST",
        packet(dict(retry, flags=FLAG_ACK_REQUEST)), "Reserved")
    new_token = dict(type="NEW_TOKEN", **hdr(), address_token=bytes(range(1, 33)))
    add("err_new_token_zero", "NEW_TOKEN with an all-zero token (it would read as no cookie)",
        packet(dict(new_token, address_token=bytes(32), _allow_zero_token=True)), "BadField")
    add("err_new_token_payload", "NEW_TOKEN with a 1-byte payload",
        packet(dict(new_token, payload=b"x")), "BadLength")
    add("err_retry_truncated", "RETRY cut inside its cookie",
        recrc(packet(retry)[:HEADER_LEN + 16] + b"\0\0\0\0"), "Truncated")
    add("err_connect_src_conn_zero", "CONNECT with source connection id 0",
        packet(dict(conn, src_conn=0)), "BadField")
    add("err_connect_src_token_zero", "CONNECT with source token 0",
        packet(dict(conn, src_token=0)), "BadField")
    add("err_accept_mtu_zero", "ACCEPT with MTU 0",
        packet(dict(conn, type="ACCEPT", dst_conn=5, token=6, mtu=0)), "BadField")
    add("err_write_past_message", "WRITE whose offset + payload exceeds the message length",
        packet(dict(base_write, msg_offset=4090, msg_len=4096)), "BadField")
    add("err_send_offset_overflow", "SEND whose offset + payload overflows 32 bits",
        packet(dict(type="SEND", **hdr(), msg_id=1, msg_offset=0xFFFFFFFF,
                    msg_len=0xFFFFFFFF, recv_index=0, payload=b"z")), "BadField")
    add("err_read_response_past_message", "READ_RESPONSE longer than its message",
        packet(dict(type="READ_RESPONSE", **hdr(), msg_id=1, msg_offset=0, msg_len=3,
                    key=1, addr=0, payload=b"four")), "BadField")
    return c


def malformed_frame_cases():
    """(name, description, frame bytes, expected parse_frame error)"""
    transport = packet(dict(type="KEEPALIVE", **hdr()))
    good4 = frame(V4_ENCAP, transport)
    good6 = frame(V6_ENCAP, transport)
    c = []

    def flip(raw, index, mask):
        b = bytearray(raw)
        b[index] ^= mask
        return bytes(b)

    c.append(("err_frame_ipv4_checksum", "IPv4 header checksum wrong",
              flip(good4, 14 + 10, 0x01), "Encapsulation"))
    c.append(("err_frame_udp_checksum", "UDP checksum wrong (IPv6)",
              flip(good6, 14 + 40 + 6, 0x01), "Encapsulation"))
    c.append(("err_frame_wrong_port", "UDP destination port 4791 (RoCEv2), not MetaRoCE",
              frame(dict(V4_ENCAP, udp_dst_port=4791), transport), "NotMetaRoce"))
    c.append(("err_frame_arp", "EtherType ARP", good4[:12] + b"\x08\x06" + good4[14:],
              "NotMetaRoce"))
    c.append(("err_frame_short", "10 bytes: not even an Ethernet header", good4[:10],
              "Truncated"))
    c.append(("err_frame_ipv4_more_fragments", "IPv4 fragment: More Fragments set (spec 3.1.5)",
              ipv4_edit(good4, 6, b"\x20\x00"), "Encapsulation"))
    c.append(("err_frame_ipv4_fragment_offset", "IPv4 fragment: offset 8 bytes (spec 3.1.5)",
              ipv4_edit(good4, 6, b"\x00\x01"), "Encapsulation"))
    c.append(("err_frame_ipv4_tcp", "IPv4 protocol 6 (TCP), not UDP",
              ipv4_edit(good4, 9, b"\x06"), "NotMetaRoce"))
    c.append(("err_frame_ipv4_version_6", "EtherType IPv4 but IP version 6",
              ipv4_edit(good4, 0, b"\x65"), "Encapsulation"))
    c.append(("err_frame_ipv6_next_header_tcp", "IPv6 next header 6 (TCP), not UDP",
              good6[:14 + 6] + b"\x06" + good6[14 + 7:], "NotMetaRoce"))
    c.append(("err_frame_udp_dst_port_zero", "UDP destination port 0 (spec 3.1.5)",
              frame(dict(V4_ENCAP, udp_dst_port=0), transport), "Encapsulation"))
    c.append(("err_frame_udp_length_past_ip", "UDP length larger than the IP payload",
              good4[:14 + 24] + struct.pack(">H", 8 + len(transport) + 1) + good4[14 + 26:],
              "Encapsulation"))
    c.append(("err_frame_ipv6_udp_zero_checksum",
              "IPv6 with UDP checksum 0, invalid over IPv6 (spec 3.1.5, RFC 8200)",
              good6[:14 + 46] + b"\0\0" + good6[14 + 48:], "Encapsulation"))
    return c


def ipv4_edit(eth_frame, offset, data):
    """Overwrite bytes of the IPv4 header (offset from its start) and
    recompute its header checksum, so only the edit is wrong."""
    b = bytearray(eth_frame)
    b[14 + offset:14 + offset + len(data)] = data
    ihl = (b[14] & 0x0F) * 4 if b[14] >> 4 == 4 else 20
    b[14 + 10:14 + 12] = b"\0\0"
    b[14 + 10:14 + 12] = struct.pack(">H", checksum(bytes(b[14:14 + ihl])))
    return bytes(b)


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

FIELD_ORDER = [
    "type", "type_code", "flags", "dst_conn", "token", "psn", "path", "timestamp",
    "msg_id", "msg_offset", "msg_len", "key", "addr", "recv_index", "imm",
    "len", "source_key", "source_addr", "sink_key", "sink_addr",
    "cumulative", "echo_psn", "echo_timestamp", "echo_path", "path_rx_count", "path_ce_count",
    "rate_hint_mbps", "sack_offset", "sack", "nak_psn", "reason", "reason_code",
    "src_conn", "src_token", "mtu", "max_paths", "window", "reply_port", "initial_psn",
    "timer_profile", "suite", "key_id", "rate_grant_mbps", "cookie", "address_token",
]


def fmt_value(key, v):
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, list):
        return ",".join(str(i) for i in v)
    if isinstance(v, int):
        if key in HEX_WIDTHS:
            return "0x%0*x" % (HEX_WIDTHS[key], v)
        return str(v)
    return str(v)


def render(name, desc, lines):
    out = ["# MetaRoCE golden vector: " + desc,
           "# Generated by compliance/vectors/generate.py; do not edit by hand.",
           "name = " + name]
    out += [("%s = %s" % (k, v)).rstrip() for k, v in lines]
    return "\n".join(out) + "\n"


def valid_file(name, desc, f, encap):
    f = dict(f)
    f["type_code"] = TYPE_CODES[f["type"]]
    if f["type"] == "NAK":
        f["reason_code"] = NAK_REASONS[f["reason"]]
    if f["type"] == "CLOSE":
        f["reason_code"] = CLOSE_REASONS[f["reason"]]
    raw = packet(f)
    lines = [(k, fmt_value(k, f[k])) for k in FIELD_ORDER if k in f]
    payload = f.get("payload", b"")
    lines.append(("payload_len", str(len(payload))))
    lines.append(("payload", payload.hex()))
    lines.append(("bytes", raw.hex()))
    if encap is not None:
        for k in ("eth_src", "eth_dst", "ip_version", "ip_src", "ip_dst", "udp_src_port",
                  "udp_dst_port", "dscp"):
            lines.append((k, str(encap[k])))
        lines.append(("ecn", ECN_NAMES[encap["ecn"]]))
        lines.append(("hop_limit", str(encap["hop_limit"])))
        lines.append(("frame", frame(encap, raw).hex()))
    return render(name, desc, lines)


def all_files():
    files = {}
    for name, desc, f, encap in valid_cases():
        files[name] = valid_file(name, desc, f, encap)
    for name, desc, raw, error in malformed_cases():
        files[name] = render(name, desc, [("error", error), ("bytes", raw.hex())])
    for name, desc, raw, error in malformed_frame_cases():
        files[name] = render(name, desc, [("udp_dst_port", str(DEFAULT_UDP_PORT)),
                                          ("frame_error", error), ("frame", raw.hex())])
    return files


def sync(here, files, what, check):
    """Writes `files` (name -> text) as `here/<name>.vec` and removes the
    .vec files no longer generated; with `check`, changes nothing and
    fails if any is out of date. Shared by every generator here."""
    stale = []
    for name, text in sorted(files.items()):
        path = os.path.join(here, name + ".vec")
        old = None
        if os.path.exists(path):
            with open(path, encoding="ascii") as fh:
                old = fh.read()
        if old != text:
            stale.append(name)
            if not check:
                with open(path, "w", encoding="ascii") as fh:
                    fh.write(text)
    extra = sorted(n[:-4] for n in os.listdir(here)
                   if n.endswith(".vec") and n[:-4] not in files)
    if check:
        if stale or extra:
            print("out of date: %s; not generated: %s" % (stale, extra), file=sys.stderr)
            return 1
        print("%d %s files up to date" % (len(files), what))
        return 0
    for n in extra:
        os.remove(os.path.join(here, n + ".vec"))
    print("%d %s files (%d rewritten, %d removed)" % (len(files), what, len(stale), len(extra)))
    return 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    return sync(here, all_files(), "vector", "--check" in sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
