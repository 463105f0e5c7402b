#!/usr/bin/env python3
"""Golden vectors for the RoCEv2 baseline (crate `roce-baseline`).

Writes one `<name>.vec` file per packet: a whole IP packet (IPv4 or IPv6
header, UDP header to port 4791, InfiniBand transport headers, payload, pad,
ICRC) and the header fields it carries, one `key: value` per line. The Rust
test `roce/tests/vectors.rs` parses every packet and compares the fields, and
emits every field set and compares the bytes.

This script is an independent implementation of the wire format: it uses only
`struct` and `zlib.crc32`, written from the InfiniBand specification (Vol. 1
chapter 9 headers, annex A17 ICRC) and the description of Linux
`drivers/infiniband/sw/rxe/rxe_icrc.c`, not from the Rust code. The ICRC is
CRC-32 over 8 bytes of 0xFF, the IP header with TOS/TTL/checksum (IPv4) or
traffic class/flow label/hop limit (IPv6) set to ones, the UDP header with its
checksum set to ones, the BTH with byte 4 set to ones, and the rest of the
packet; it is sent least significant byte first.

Two vectors come from outside this project, and check this script and the
Rust code against something neither wrote:
* `cnp_connectx4lx`: a CNP captured on an NVIDIA ConnectX-4 Lx, published as
  the "RoCE CNP captured on ConnectX-4 Lx" case of scapy's
  `test/contrib/roce.uts` (Ethernet header removed here).
* `uc_send_only_scapy`: the UC SEND-only example of the same file, whose ICRC
  (0x78f353f3 as scapy prints the wire bytes) scapy computes. UC is not part
  of the RC baseline, so this one checks the ICRC only.

Run: python3 compliance/vectors/roce/generate.py   (rewrites the .vec files)
"""

import os
import socket
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROCE_PORT = 4791

OPCODES = {
    "SendFirst": 0x00, "SendMiddle": 0x01, "SendLast": 0x02, "SendLastImm": 0x03,
    "SendOnly": 0x04, "SendOnlyImm": 0x05, "WriteFirst": 0x06, "WriteMiddle": 0x07,
    "WriteLast": 0x08, "WriteLastImm": 0x09, "WriteOnly": 0x0A, "WriteOnlyImm": 0x0B,
    "ReadRequest": 0x0C, "ReadResponseFirst": 0x0D, "ReadResponseMiddle": 0x0E,
    "ReadResponseLast": 0x0F, "ReadResponseOnly": 0x10, "Acknowledge": 0x11, "Cnp": 0x81,
}
HAS_RETH = {"WriteFirst", "WriteOnly", "WriteOnlyImm", "ReadRequest"}
HAS_AETH = {"ReadResponseFirst", "ReadResponseLast", "ReadResponseOnly", "Acknowledge"}
HAS_IMM = {"SendLastImm", "SendOnlyImm", "WriteLastImm", "WriteOnlyImm"}


def ones_complement_sum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def checksum(data):
    return (~ones_complement_sum(data)) & 0xFFFF


def ipv4_udp(src, dst, sport, transport_len, tos=0x6A, ident=0x1234, ttl=64, udp_csum=False):
    udp_len = 8 + transport_len
    total = 20 + udp_len
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, total, ident, 0x4000, ttl, 17, 0,
                               socket.inet_aton(src), socket.inet_aton(dst)))
    ip[10:12] = struct.pack("!H", checksum(bytes(ip)))
    udp = bytearray(struct.pack("!HHHH", sport, ROCE_PORT, udp_len, 0))
    return ip, udp, udp_csum


def ipv6_udp(src, dst, sport, transport_len, tclass=0x6A, flow=0x12345, hop=64):
    udp_len = 8 + transport_len
    first = (6 << 28) | (tclass << 20) | flow
    ip = bytearray(struct.pack("!IHBB16s16s", first, udp_len, 17, hop,
                               socket.inet_pton(socket.AF_INET6, src),
                               socket.inet_pton(socket.AF_INET6, dst)))
    udp = bytearray(struct.pack("!HHHH", sport, ROCE_PORT, udp_len, 0))
    return ip, udp, True


def fill_udp_checksum(ip, udp, transport):
    if ip[0] >> 4 == 4:
        pseudo = bytes(ip[12:20]) + struct.pack("!BBH", 0, 17, len(udp) + len(transport))
    else:
        pseudo = bytes(ip[8:40]) + struct.pack("!IxxxB", len(udp) + len(transport), 17)
    c = checksum(pseudo + bytes(udp) + transport)
    udp[6:8] = struct.pack("!H", c or 0xFFFF)


def icrc(ip, udp, transport_without_icrc):
    mip = bytearray(ip)
    if mip[0] >> 4 == 4:
        mip[1] = 0xFF
        mip[8] = 0xFF
        mip[10:12] = b"\xff\xff"
    else:
        mip[0] |= 0x0F
        mip[1:4] = b"\xff\xff\xff"
        mip[7] = 0xFF
    mudp = bytearray(udp)
    mudp[6:8] = b"\xff\xff"
    t = bytearray(transport_without_icrc)
    t[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(mip) + bytes(mudp) + bytes(t)) & 0xFFFFFFFF


def bth(f):
    byte1 = (f["se"] << 7) | (f["m"] << 6) | (f["pad"] << 4) | f["tver"]
    byte4 = (f["fecn"] << 7) | (f["becn"] << 6)
    return struct.pack("!BBHB3sB3s", OPCODES[f["opcode"]], byte1, f["pkey"], byte4,
                       f["dqpn"].to_bytes(3, "big"), f["ackreq"] << 7, f["psn"].to_bytes(3, "big"))


def syndrome_byte(s):
    kind, value = s
    return {"ack": 0x00, "rnr": 0x20, "nak": 0x60}[kind] | value


def transport(f, payload):
    out = bytearray(bth(f))
    op = f["opcode"]
    if op in HAS_RETH:
        out += struct.pack("!QII", f["reth.va"], f["reth.rkey"], f["reth.len"])
    if op in HAS_AETH:
        out += bytes([syndrome_byte(f["aeth.syndrome"])]) + f["aeth.msn"].to_bytes(3, "big")
    if op in HAS_IMM:
        out += struct.pack("!I", f["imm"])
    if op == "Cnp":
        out += bytes(16)
    out += payload + bytes(f["pad"])
    return bytes(out)


def payload_bytes(n, salt):
    return bytes((i * 7 + salt) & 0xFF for i in range(n))


def base_fields(opcode, psn, payload_len, **kw):
    f = {"opcode": opcode, "se": 0, "m": 0, "pad": (4 - payload_len % 4) % 4, "tver": 0,
         "pkey": 0xFFFF, "fecn": 0, "becn": 0, "dqpn": 0x000112, "ackreq": 0, "psn": psn}
    f.update(kw)
    return f


def write_vector(name, description, source, packet, f, payload_len, kind="rc"):
    lines = ["# " + description, "name: " + name, "source: " + source, "kind: " + kind,
             "packet: " + packet.hex()]
    if kind == "rc":
        op = f["opcode"]
        lines.append("opcode: %s" % op)
        for k in ("se", "m", "pad", "tver", "pkey", "fecn", "becn", "dqpn", "ackreq", "psn"):
            lines.append("%s: %s" % (k, hex(f[k]) if k in ("pkey", "dqpn", "psn") else f[k]))
        if op in HAS_RETH:
            lines += ["reth.va: %#x" % f["reth.va"], "reth.rkey: %#x" % f["reth.rkey"],
                      "reth.len: %d" % f["reth.len"]]
        if op in HAS_AETH:
            kind_, value = f["aeth.syndrome"]
            lines += ["aeth.syndrome: %s %d" % (kind_, value), "aeth.msn: %#x" % f["aeth.msn"]]
        if op in HAS_IMM:
            lines.append("imm: %#x" % f["imm"])
        lines.append("payload_len: %d" % payload_len)
    with open(os.path.join(HERE, name + ".vec"), "w") as out:
        out.write("\n".join(lines) + "\n")


def generated(name, description, f, payload_len, v6=False, udp_csum=False):
    payload = payload_bytes(payload_len, OPCODES[f["opcode"]])
    body = transport(f, payload)
    length = len(body) + 4
    if v6:
        ip, udp, csum = ipv6_udp("fd00::1", "fd00::2", 0xC0DE, length)
    else:
        ip, udp, csum = ipv4_udp("192.0.2.1", "192.0.2.2", 0xC0DE, length, udp_csum=udp_csum)
    crc = icrc(ip, udp, body)
    t = body + struct.pack("<I", crc)
    if csum or udp_csum:
        fill_udp_checksum(ip, udp, t)
    write_vector(name, description, "generate.py (independent Python implementation, zlib.crc32)",
                 bytes(ip) + bytes(udp) + t, f, payload_len)


def main():
    for old in os.listdir(HERE):
        if old.endswith(".vec"):
            os.remove(os.path.join(HERE, old))
    psn = 0xABCDEF
    reth = {"reth.va": 0x00007F0012345678, "reth.rkey": 0x00000A01, "reth.len": 40}
    ack = {"aeth.syndrome": ("ack", 31), "aeth.msn": 0x000102}
    cases = [
        ("send_first", "SEND First, 16 bytes", base_fields("SendFirst", psn, 16), 16),
        ("send_middle", "SEND Middle, 16 bytes", base_fields("SendMiddle", psn, 16), 16),
        ("send_last", "SEND Last, 13 bytes (pad 3), AckReq, SE",
         base_fields("SendLast", psn, 13, ackreq=1, se=1), 13),
        ("send_last_imm", "SEND Last with immediate, 8 bytes",
         base_fields("SendLastImm", psn, 8, ackreq=1, se=1, imm=0xDEADBEEF), 8),
        ("send_only", "SEND Only, 1 byte (pad 3)", base_fields("SendOnly", 0, 1, ackreq=1, se=1), 1),
        ("send_only_imm", "SEND Only with immediate, no payload",
         base_fields("SendOnlyImm", 0xFFFFFF, 0, ackreq=1, imm=0x01020304), 0),
        ("write_first", "RDMA WRITE First with RETH, 16 bytes",
         base_fields("WriteFirst", psn, 16, **reth), 16),
        ("write_middle", "RDMA WRITE Middle, 16 bytes", base_fields("WriteMiddle", psn, 16), 16),
        ("write_last", "RDMA WRITE Last, 8 bytes", base_fields("WriteLast", psn, 8, ackreq=1), 8),
        ("write_last_imm", "RDMA WRITE Last with immediate, 6 bytes (pad 2)",
         base_fields("WriteLastImm", psn, 6, ackreq=1, imm=0xCAFEF00D), 6),
        ("write_only", "RDMA WRITE Only with RETH, 40 bytes",
         base_fields("WriteOnly", psn, 40, ackreq=1, **reth), 40),
        ("write_only_imm", "RDMA WRITE Only with RETH and immediate, 10 bytes (pad 2)",
         base_fields("WriteOnlyImm", psn, 10, ackreq=1, imm=7,
                     **dict(reth, **{"reth.len": 10})), 10),
        ("read_request", "RDMA READ Request with RETH for 1 MiB",
         base_fields("ReadRequest", psn, 0, **dict(reth, **{"reth.len": 1 << 20})), 0),
        ("read_response_first", "RDMA READ Response First with AETH, 16 bytes",
         base_fields("ReadResponseFirst", psn, 16, **ack), 16),
        ("read_response_middle", "RDMA READ Response Middle, 16 bytes",
         base_fields("ReadResponseMiddle", psn, 16), 16),
        ("read_response_last", "RDMA READ Response Last with AETH, 5 bytes (pad 3)",
         base_fields("ReadResponseLast", psn, 5, **ack), 5),
        ("read_response_only", "RDMA READ Response Only with AETH, 12 bytes",
         base_fields("ReadResponseOnly", psn, 12, **ack), 12),
        ("ack", "ACKNOWLEDGE: ACK, unlimited credits", base_fields("Acknowledge", psn, 0, **ack), 0),
        ("rnr_nak", "ACKNOWLEDGE: RNR NAK, timer code 12 (0.64 ms)",
         base_fields("Acknowledge", psn, 0, **{"aeth.syndrome": ("rnr", 12), "aeth.msn": 5}), 0),
        ("nak_psn_sequence", "ACKNOWLEDGE: NAK PSN sequence error",
         base_fields("Acknowledge", psn, 0, **{"aeth.syndrome": ("nak", 0), "aeth.msn": 5}), 0),
        ("nak_invalid_request", "ACKNOWLEDGE: NAK invalid request",
         base_fields("Acknowledge", psn, 0, **{"aeth.syndrome": ("nak", 1), "aeth.msn": 5}), 0),
        ("nak_remote_access", "ACKNOWLEDGE: NAK remote access error",
         base_fields("Acknowledge", psn, 0, **{"aeth.syndrome": ("nak", 2), "aeth.msn": 5}), 0),
        ("nak_remote_operational", "ACKNOWLEDGE: NAK remote operational error",
         base_fields("Acknowledge", psn, 0, **{"aeth.syndrome": ("nak", 3), "aeth.msn": 5}), 0),
        ("cnp", "Congestion Notification Packet (BECN, 16 reserved bytes)",
         base_fields("Cnp", 0, 0, becn=1, dqpn=0x000011), 0),
    ]
    for name, desc, f, n in cases:
        generated(name + "_v4", desc + ", IPv4", f, n)
    for name, desc, f, n in cases:
        if name in ("send_only", "write_first", "read_response_last", "ack", "cnp"):
            generated(name + "_v6", desc + ", IPv6", f, n, v6=True)
    generated("write_only_v4_udp_checksum", "RDMA WRITE Only, IPv4 with a UDP checksum",
              base_fields("WriteOnly", psn, 40, ackreq=1, fecn=1, **reth), 40, udp_csum=True)

    cx4 = bytes.fromhex(
        "45c2003c718c400040119161" "0a001101" "0a001201"  # IPv4: DSCP 48, ECT(0)
        "000012b700280000"  # UDP: source port 0, checksum 0
        "8100ffff400001180000000" "0"  # BTH: CNP, BECN, QP 0x118, PSN 0
        + "00" * 16  # reserved
        + "82fd002a"  # ICRC
    )
    assert len(cx4) == 60 and icrc(cx4[:20], cx4[20:28], cx4[28:56]) == 0x2A00FD82
    write_vector("cnp_connectx4lx", "CNP captured on a ConnectX-4 Lx (scapy test/contrib/roce.uts)",
                 "hardware capture published in scapy test/contrib/roce.uts", cx4,
                 base_fields("Cnp", 0, 0, becn=1, dqpn=0x000118), 0)
    uc = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 1, 64, 1144, 0x4000, 64, 17, 0,
                               socket.inet_aton("192.168.0.7"), socket.inet_aton("192.168.0.7")))
    uc[10:12] = struct.pack("!H", 0xB4D5)
    uc += struct.pack("!HHHH", 49152, ROCE_PORT, 44, 0xACA2)
    uc += struct.pack("!BBHII", 0x24, 0x60, 0xFFFF, 211, 13571856)
    uc += b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00"
    uc += bytes.fromhex("78f353f3")
    assert icrc(uc[:20], uc[20:28], bytes(uc[28:-4])) == struct.unpack("<I", uc[-4:])[0]
    write_vector("uc_send_only_scapy", "UC SEND Only example of scapy test/contrib/roce.uts",
                 "scapy test/contrib/roce.uts (ICRC computed by scapy)", bytes(uc), None, 0,
                 kind="icrc-only")


if __name__ == "__main__":
    main()
