-- MetaRoCE dissector for Wireshark / tshark (spec: docs/spec/03-wire-format.md).
--
-- Decodes every packet type of MetaRoCE v1 carried in UDP: the 28-byte
-- common header (3.2), each type's extension header (3.4-3.8), the payload,
-- the 256-bit SACK bitvector of ACKs (3.6, bit i = PSN cumulative + 1 + i)
-- the security extension and tag of protected packets (5.3.2; the payload
-- stays encrypted), 0-RTT (4.2.4: the EARLY flag, the early proof of a
-- CONNECT with its time as a date, early packets marked as addressed with
-- the sender's own id and token), address tokens (4.2.5: NEW_TOKEN, and a
-- CONNECT whose Cookie field holds one, told by the RECOMMENDED
-- constructions' format byte) and the CRC-32 trailer (3.9, verified).
-- UDP port 4795 is registered; a
-- heuristic also claims packets on other ports (replies go to the peer's
-- own port, and path entropy varies the source port).
--
-- Install: see tools/wireshark/README.md.

local metaroce = Proto("metaroce", "MetaRoCE")

local types = {
    [0x01] = "WRITE", [0x02] = "WRITE_IMM", [0x03] = "SEND", [0x04] = "SEND_IMM",
    [0x05] = "READ_REQUEST", [0x06] = "READ_RESPONSE",
    [0x10] = "ACK", [0x11] = "NAK",
    [0x20] = "CONNECT", [0x21] = "ACCEPT", [0x22] = "CLOSE", [0x23] = "KEEPALIVE",
    [0x24] = "RETRY", [0x25] = "NEW_TOKEN",
}
-- Extension header length per type (3.3).
local ext_len = {
    [0x01] = 24, [0x02] = 32, [0x03] = 16, [0x04] = 20, [0x05] = 32, [0x06] = 24,
    [0x10] = 56, [0x11] = 12, [0x20] = 64, [0x21] = 64, [0x22] = 4, [0x23] = 0,
    [0x24] = 32, [0x25] = 32,
}
local timer_profiles = { [0] = "DATA_CENTER", [1] = "EMULATION" }
local suites = { [0] = "NONE", [1] = "AES_256_GCM" }
local nak_reasons = {
    [1] = "INVALID_KEY", [2] = "ACCESS_DENIED", [3] = "OUT_OF_BOUNDS",
    [4] = "PROTOCOL_ERROR", [5] = "RECEIVER_NOT_READY", [6] = "RECEIVE_TOO_SMALL",
}
local close_reasons = { [0] = "NORMAL", [1] = "ERROR", [2] = "IDLE_TIMEOUT", [3] = "REJECTED", [4] = "RECLAIMED" }

local HEADER_LEN = 28
local VERSION = 2
local CRC_LEN = 4
-- A protected packet (5.3.2): 16-byte security extension and 16-byte tag.
local FLAG_PROTECTED = 0x0008
-- 0-RTT (4.2.4): a CONNECT's Cookie field is an early proof; a reliable
-- packet is sent before the ACCEPT, with the sender's own id and token.
local FLAG_EARLY = 0x0010
local SECURITY_LEN = 16
local TAG_LEN = 16


local f = {
    version = ProtoField.uint8("metaroce.version", "Version", base.DEC),
    type = ProtoField.uint8("metaroce.type", "Type", base.DEC, types),
    flags = ProtoField.uint16("metaroce.flags", "Flags", base.HEX),
    flag_ack_request = ProtoField.bool("metaroce.flags.ack_request", "ACK_REQUEST", 16, nil, 0x0001),
    flag_retransmission = ProtoField.bool("metaroce.flags.retransmission", "RETRANSMISSION", 16, nil, 0x0002),
    flag_close_reply = ProtoField.bool("metaroce.flags.close_reply", "CLOSE_REPLY", 16, nil, 0x0004),
    flag_protected = ProtoField.bool("metaroce.flags.protected", "PROTECTED", 16, nil, 0x0008),
    flag_early = ProtoField.bool("metaroce.flags.early", "EARLY", 16, nil, 0x0010),
    -- 0-RTT (4.2.4): the early proof in a CONNECT's Cookie field, and the
    -- mark of an early packet.
    early_proof = ProtoField.bytes("metaroce.early.proof", "Early Proof"),
    early_time = ProtoField.absolute_time("metaroce.early.time", "Proof Time", base.UTC),
    early_time_ns = ProtoField.uint64("metaroce.early.time_ns", "Proof Time (ns since the Unix epoch)", base.DEC),
    early_reserved = ProtoField.bytes("metaroce.early.reserved", "Proof Reserved (zero)"),
    early_tag = ProtoField.bytes("metaroce.early.tag", "Proof Tag"),
    early_data = ProtoField.bool("metaroce.early_data", "Early packet (0-RTT: sender's own id and token, 4.2.4)"),
    dst_conn = ProtoField.uint32("metaroce.dst_conn", "Destination Connection ID", base.HEX),
    token = ProtoField.uint64("metaroce.token", "Connection Token", base.HEX),
    psn = ProtoField.uint32("metaroce.psn", "PSN", base.DEC),
    path = ProtoField.uint16("metaroce.path", "Path ID", base.DEC),
    -- CONNECT and ACCEPT carry the sender's READ Depth in the Path ID
    -- field (3.8.1): 0 = not stated.
    read_depth = ProtoField.uint16("metaroce.read_depth", "READ Depth", base.DEC),
    payload_len = ProtoField.uint16("metaroce.payload_len", "Payload Length", base.DEC),
    timestamp = ProtoField.uint32("metaroce.timestamp", "Timestamp (ns mod 2^32)", base.DEC),
    -- Data packets (3.4).
    msg_id = ProtoField.uint32("metaroce.msg.id", "Message ID", base.DEC),
    msg_offset = ProtoField.uint32("metaroce.msg.offset", "Message Offset", base.DEC),
    msg_len = ProtoField.uint32("metaroce.msg.len", "Message Length", base.DEC),
    key = ProtoField.uint32("metaroce.key", "Memory Key", base.HEX),
    addr = ProtoField.uint64("metaroce.addr", "Address", base.HEX),
    imm = ProtoField.uint32("metaroce.imm", "Immediate", base.HEX),
    recv_index = ProtoField.uint32("metaroce.recv_index", "Receive Index", base.DEC),
    read_len = ProtoField.uint32("metaroce.read.len", "Length", base.DEC),
    source_key = ProtoField.uint32("metaroce.read.source_key", "Source Key", base.HEX),
    source_addr = ProtoField.uint64("metaroce.read.source_addr", "Source Address", base.HEX),
    sink_key = ProtoField.uint32("metaroce.read.sink_key", "Sink Key", base.HEX),
    sink_addr = ProtoField.uint64("metaroce.read.sink_addr", "Sink Address", base.HEX),
    payload = ProtoField.bytes("metaroce.payload", "Payload"),
    -- ACK (3.5, 3.6).
    cumulative = ProtoField.uint32("metaroce.ack.cumulative", "Cumulative PSN", base.DEC),
    echo_psn = ProtoField.uint32("metaroce.ack.echo_psn", "Echo PSN", base.DEC),
    echo_timestamp = ProtoField.uint32("metaroce.ack.echo_timestamp", "Echo Timestamp", base.DEC),
    echo_path = ProtoField.uint16("metaroce.ack.echo_path", "Echo Path ID", base.DEC),
    path_rx_count = ProtoField.uint16("metaroce.ack.path_rx_count", "Path RX Count", base.DEC),
    path_ce_count = ProtoField.uint16("metaroce.ack.path_ce_count", "Path CE Count", base.DEC),
    sack_offset = ProtoField.uint16("metaroce.ack.sack_offset", "SACK Offset", base.DEC),
    rate_hint = ProtoField.uint32("metaroce.ack.rate_hint", "Rate Hint (Mbit/s)", base.DEC),
    sack = ProtoField.bytes("metaroce.ack.sack", "SACK bitvector"),
    sack_bits = ProtoField.string("metaroce.ack.sack_bits", "SACK bits set"),
    sack_psns = ProtoField.string("metaroce.ack.sack_psns", "SACKed PSNs"),
    sack_count = ProtoField.uint16("metaroce.ack.sack_count", "SACK bits set (count)", base.DEC),
    -- NAK (3.7).
    nak_cumulative = ProtoField.uint32("metaroce.nak.cumulative", "Cumulative PSN", base.DEC),
    nak_psn = ProtoField.uint32("metaroce.nak.psn", "NAK PSN", base.DEC),
    nak_reason = ProtoField.uint8("metaroce.nak.reason", "Reason", base.DEC, nak_reasons),
    -- CONNECT / ACCEPT (3.8.1), CLOSE (3.8.2).
    src_conn = ProtoField.uint32("metaroce.src_conn", "Source Connection ID", base.HEX),
    src_token = ProtoField.uint64("metaroce.src_token", "Source Token", base.HEX),
    mtu = ProtoField.uint16("metaroce.mtu", "MTU", base.DEC),
    max_paths = ProtoField.uint16("metaroce.max_paths", "Paths", base.DEC),
    window = ProtoField.uint32("metaroce.window", "Window", base.DEC),
    reply_port = ProtoField.uint16("metaroce.reply_port", "Reply Port", base.DEC),
    timer_profile = ProtoField.uint8("metaroce.timer_profile", "Timer Profile", base.DEC,
        timer_profiles),
    suite = ProtoField.uint8("metaroce.suite", "Cipher Suite", base.DEC, suites),
    initial_psn = ProtoField.uint32("metaroce.initial_psn", "Initial PSN", base.DEC),
    key_id = ProtoField.uint32("metaroce.key_id", "Key ID", base.HEX),
    cookie = ProtoField.bytes("metaroce.cookie", "Cookie"),
    -- Byte 4 of the RECOMMENDED cookie and token constructions (4.2.2,
    -- 4.2.5): 1 cookie, 2 address token. Private to the acceptor: another
    -- construction may put anything there.
    cookie_format = ProtoField.uint8("metaroce.cookie.format", "Format (RECOMMENDED constructions)",
        base.DEC, { [1] = "cookie", [2] = "address token" }),
    -- NEW_TOKEN (3.8.5): the address token.
    new_token = ProtoField.bytes("metaroce.new_token.token", "Address Token"),
    rate_grant = ProtoField.uint32("metaroce.accept.rate_grant", "Rate Grant (Mbit/s)", base.DEC),
    close_reason = ProtoField.uint8("metaroce.close.reason", "Reason", base.DEC, close_reasons),
    -- Packet protection (5.3.2): security extension and tag.
    sec_key_id = ProtoField.uint32("metaroce.sec.key_id", "Security Key ID", base.HEX),
    sec_reserved = ProtoField.uint32("metaroce.sec.reserved", "Security Reserved", base.HEX),
    sec_iv = ProtoField.uint64("metaroce.sec.iv", "IV", base.DEC),
    ciphertext = ProtoField.bytes("metaroce.ciphertext", "Encrypted Payload"),
    tag = ProtoField.bytes("metaroce.tag", "Authentication Tag"),
    -- Trailer (3.9).
    crc = ProtoField.uint32("metaroce.crc", "CRC-32", base.HEX),
    crc_ok = ProtoField.bool("metaroce.crc_ok", "CRC valid"),
}
metaroce.fields = f

local e_malformed = ProtoExpert.new("metaroce.malformed", "Malformed MetaRoCE packet",
    expert.group.MALFORMED, expert.severity.ERROR)
local e_bad_crc = ProtoExpert.new("metaroce.bad_crc", "CRC-32 trailer mismatch",
    expert.group.CHECKSUM, expert.severity.ERROR)
local e_psn_field = ProtoExpert.new("metaroce.psn_field",
    "PSN field is not the Initial PSN (spec 3.2.4)", expert.group.PROTOCOL, expert.severity.WARN)
local e_early_reserved = ProtoExpert.new("metaroce.early.reserved_nonzero",
    "Early proof bytes 8-15 are not zero: no acceptor takes it (spec 4.2.4)",
    expert.group.PROTOCOL, expert.severity.WARN)
local e_token_zero = ProtoExpert.new("metaroce.new_token.zero",
    "NEW_TOKEN with an all-zero token: malformed (BadField, spec 3.8.5)",
    expert.group.MALFORMED, expert.severity.ERROR)
metaroce.experts = { e_malformed, e_bad_crc, e_psn_field, e_early_reserved, e_token_zero }

-- What the PSN field holds on types without a sequence number (3.2.4):
-- receivers ignore it; the dissector names it.
local psn_meaning = {
    [0x10] = "next PSN", [0x11] = "next PSN", [0x22] = "next PSN", [0x23] = "next PSN",
    [0x25] = "next PSN",
    [0x20] = "Initial PSN", [0x21] = "Initial PSN", [0x24] = "none (0)",
}

local pref_port = 4795
metaroce.prefs.port = Pref.uint("UDP port", pref_port, "MetaRoCE UDP destination port")

-- Bit operations: Wireshark builds with Lua 5.1/5.2 offer the `bit`
-- library, Lua 5.3+ builds have operators (loaded as text so 5.1 parses
-- this file).
local band, bxor, rshift
if bit then
    band = function(a, b) return bit.band(a, b) % 0x100000000 end
    bxor = function(a, b) return bit.bxor(a, b) % 0x100000000 end
    rshift = function(a, n) return bit.rshift(a, n) % 0x100000000 end
elseif bit32 then
    band, bxor, rshift = bit32.band, bit32.bxor, bit32.rshift
else
    band = load("return function(a, b) return a & b end")()
    bxor = load("return function(a, b) return a ~ b end")()
    rshift = load("return function(a, n) return a >> n end")()
end

-- CRC-32 (IEEE, reflected, as zlib/crc32fast) over a TvbRange.
local crc_table = {}
for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
        if band(c, 1) == 1 then c = bxor(0xEDB88320, rshift(c, 1)) else c = rshift(c, 1) end
    end
    crc_table[i] = c
end
local function crc32(tvb, offset, len)
    local c = 0xFFFFFFFF
    local bytes = tvb:range(offset, len):bytes()
    for i = 0, len - 1 do
        c = bxor(crc_table[band(bxor(c, bytes:get_index(i)), 0xFF)], rshift(c, 8))
    end
    return bxor(c, 0xFFFFFFFF)
end

local function add_span(t, tvb, o)
    t:add(f.msg_id, tvb(o, 4))
    t:add(f.msg_offset, tvb(o + 4, 4))
    t:add(f.msg_len, tvb(o + 8, 4))
end

local function dissect_ack(t, tvb, o)
    local cum = tvb(o, 4):uint()
    t:add(f.cumulative, tvb(o, 4))
    t:add(f.echo_psn, tvb(o + 4, 4))
    t:add(f.echo_timestamp, tvb(o + 8, 4))
    t:add(f.echo_path, tvb(o + 12, 2))
    t:add(f.path_rx_count, tvb(o + 14, 2))
    t:add(f.path_ce_count, tvb(o + 16, 2))
    -- Bit 0 of the bitvector is PSN cum + 1 + SACK Offset (3.6).
    local offset = tvb(o + 18, 2):uint()
    t:add(f.sack_offset, tvb(o + 18, 2))
    t:add(f.rate_hint, tvb(o + 20, 4))
    local st = t:add(f.sack, tvb(o + 24, 32))
    -- Bit i is in byte i/8 under mask 0x80 >> (i mod 8) (3.6).
    local bits, psns, n = {}, {}, 0
    for i = 0, 255 do
        local byte = tvb(o + 24 + math.floor(i / 8), 1):uint()
        if band(byte, rshift(0x80, i % 8)) ~= 0 then
            n = n + 1
            bits[#bits + 1] = tostring(i)
            psns[#psns + 1] = tostring((cum + 1 + offset + i) % 0x100000000)
        end
    end
    st:add(f.sack_bits, tvb(o + 24, 32), table.concat(bits, ","))
    st:add(f.sack_psns, tvb(o + 24, 32), table.concat(psns, ","))
    st:add(f.sack_count, tvb(o + 24, 32), n)
    if offset ~= 0 then
        return string.format(" cum=%d sack=%d at +%d", cum, n, offset)
    end
    return string.format(" cum=%d sack=%d", cum, n)
end

-- The early proof of a CONNECT with EARLY (4.2.4): Time (8 bytes, ns
-- since the Unix epoch), 8 zero bytes, Tag (16 bytes).
local function dissect_proof(t, tvb, o)
    local pt = t:add(f.early_proof, tvb(o, 32))
    local ns = tvb(o, 8):uint64()
    local billion = UInt64(1000000000)
    local secs = (ns / billion):tonumber()
    local nsecs = (ns % billion):tonumber()
    pt:add(f.early_time, tvb(o, 8), NSTime.new(secs, nsecs))
    pt:add(f.early_time_ns, tvb(o, 8))
    local r = pt:add(f.early_reserved, tvb(o + 8, 8))
    for i = 0, 7 do
        if tvb(o + 8 + i, 1):uint() ~= 0 then
            r:add_proto_expert_info(e_early_reserved)
            break
        end
    end
    pt:add(f.early_tag, tvb(o + 16, 16))
    return string.format(" early proof time=%s", os.date("!%Y-%m-%dT%H:%M:%S", secs))
        .. string.format(".%09dZ", nsecs)
end

local function dissect_ext(ty, t, tvb, o, flags)
    if ty == 0x01 or ty == 0x02 or ty == 0x06 then
        add_span(t, tvb, o)
        t:add(f.key, tvb(o + 12, 4))
        t:add(f.addr, tvb(o + 16, 8))
        if ty == 0x02 then
            t:add(f.imm, tvb(o + 24, 4))
            t:add(f.recv_index, tvb(o + 28, 4))
        end
        return string.format(" msg=%d off=%d", tvb(o, 4):uint(), tvb(o + 4, 4):uint())
    elseif ty == 0x03 or ty == 0x04 then
        add_span(t, tvb, o)
        t:add(f.recv_index, tvb(o + 12, 4))
        if ty == 0x04 then t:add(f.imm, tvb(o + 16, 4)) end
        return string.format(" msg=%d off=%d", tvb(o, 4):uint(), tvb(o + 4, 4):uint())
    elseif ty == 0x05 then
        t:add(f.msg_id, tvb(o, 4))
        t:add(f.read_len, tvb(o + 4, 4))
        t:add(f.source_key, tvb(o + 8, 4))
        t:add(f.source_addr, tvb(o + 12, 8))
        t:add(f.sink_key, tvb(o + 20, 4))
        t:add(f.sink_addr, tvb(o + 24, 8))
        return string.format(" msg=%d len=%d", tvb(o, 4):uint(), tvb(o + 4, 4):uint())
    elseif ty == 0x10 then
        return dissect_ack(t, tvb, o)
    elseif ty == 0x11 then
        t:add(f.nak_cumulative, tvb(o, 4))
        t:add(f.nak_psn, tvb(o + 4, 4))
        t:add(f.nak_reason, tvb(o + 8, 1))
        local r = tvb(o + 8, 1):uint()
        return string.format(" psn=%d %s", tvb(o + 4, 4):uint(), nak_reasons[r] or "?")
    elseif ty == 0x20 or ty == 0x21 then
        t:add(f.src_conn, tvb(o, 4))
        t:add(f.src_token, tvb(o + 4, 8))
        t:add(f.mtu, tvb(o + 12, 2))
        t:add(f.max_paths, tvb(o + 14, 2))
        t:add(f.window, tvb(o + 16, 4))
        t:add(f.reply_port, tvb(o + 20, 2))
        t:add(f.timer_profile, tvb(o + 22, 1))
        t:add(f.suite, tvb(o + 23, 1))
        t:add(f.initial_psn, tvb(o + 24, 4))
        t:add(f.key_id, tvb(o + 28, 4))
        local cookie = ""
        if ty == 0x21 then
            -- ACCEPT: the Rate Grant in the Cookie field's first 4 bytes,
            -- zeros after it (3.8.1, 4.10.6).
            t:add(f.rate_grant, tvb(o + 32, 4))
            local grant = tvb(o + 32, 4):uint()
            if grant ~= 0 then cookie = string.format(" grant=%d", grant) end
        elseif band(flags, FLAG_EARLY) ~= 0 then
            -- CONNECT with EARLY: the Cookie field is an early proof.
            cookie = dissect_proof(t, tvb, o + 32)
        else
            local ct = t:add(f.cookie, tvb(o + 32, 32))
            for i = 0, 31 do
                if tvb(o + 32 + i, 1):uint() ~= 0 then cookie = " cookie"; break end
            end
            if cookie ~= "" then
                -- A cookie from a RETRY, or an address token from a
                -- NEW_TOKEN (4.2.5): opaque, told apart by the acceptor;
                -- the RECOMMENDED constructions say which in byte 4.
                ct:add(f.cookie_format, tvb(o + 36, 1))
                if tvb(o + 36, 1):uint() == 2 then cookie = " token" end
            end
        end
        return string.format(" mtu=%d paths=%d window=%d%s", tvb(o + 12, 2):uint(),
            tvb(o + 14, 2):uint(), tvb(o + 16, 4):uint(), cookie)
    elseif ty == 0x24 then
        local ct = t:add(f.cookie, tvb(o, 32))
        ct:add(f.cookie_format, tvb(o + 4, 1))
        return ""
    elseif ty == 0x25 then
        -- NEW_TOKEN (3.8.5): opaque to the initiator, never all zero.
        local tt = t:add(f.new_token, tvb(o, 32))
        tt:add(f.cookie_format, tvb(o + 4, 1))
        for i = 0, 31 do
            if tvb(o + i, 1):uint() ~= 0 then return "" end
        end
        tt:add_proto_expert_info(e_token_zero)
        return " [all-zero token]"
    elseif ty == 0x22 then
        t:add(f.close_reason, tvb(o, 1))
        return " " .. (close_reasons[tvb(o, 1):uint()] or "?")
    end
    return ""
end

-- Bytes protection adds to a packet with these flags.
local function protection_len(flags)
    if band(flags, FLAG_PROTECTED) ~= 0 then return SECURITY_LEN + TAG_LEN end
    return 0
end

-- Whether `tvb` looks like a MetaRoCE packet: version 2, a known type and
-- a length that matches the header.
local function plausible(tvb)
    local len = tvb:len()
    if len < HEADER_LEN + CRC_LEN or tvb(0, 1):uint() ~= VERSION then return false end
    local el = ext_len[tvb(1, 1):uint()]
    if el == nil then return false end
    return len == HEADER_LEN + el + protection_len(tvb(2, 2):uint()) + tvb(22, 2):uint() + CRC_LEN
end

function metaroce.dissector(tvb, pinfo, tree)
    local len = tvb:len()
    pinfo.cols.protocol = "MetaRoCE"
    local t = tree:add(metaroce, tvb(), "MetaRoCE")
    if len < HEADER_LEN + CRC_LEN then
        t:add_proto_expert_info(e_malformed, "shorter than the common header and trailer")
        pinfo.cols.info = "MetaRoCE (truncated)"
        return len
    end
    local ty = tvb(1, 1):uint()
    t:add(f.version, tvb(0, 1))
    t:add(f.type, tvb(1, 1))
    local ft = t:add(f.flags, tvb(2, 2))
    ft:add(f.flag_ack_request, tvb(2, 2))
    ft:add(f.flag_retransmission, tvb(2, 2))
    ft:add(f.flag_close_reply, tvb(2, 2))
    ft:add(f.flag_protected, tvb(2, 2))
    ft:add(f.flag_early, tvb(2, 2))
    local flags = tvb(2, 2):uint()
    -- An early packet (EARLY on a type other than CONNECT) carries the
    -- sender's own id and token (3.2.1, 4.2.4).
    local early_data = band(flags, FLAG_EARLY) ~= 0 and ty ~= 0x20
    local dst_item = t:add(f.dst_conn, tvb(4, 4))
    local token_item = t:add(f.token, tvb(8, 8))
    if early_data then
        dst_item:append_text(" (the sender's own Source Connection ID, 4.2.4)")
        token_item:append_text(" (the sender's own Source Token, 4.2.4)")
        t:add(f.early_data, tvb(2, 2), true)
    end
    local psn_item = t:add(f.psn, tvb(16, 4))
    local meaning = psn_meaning[ty]
    if meaning then
        psn_item:append_text(" (" .. meaning .. ", informational, 3.2.4)")
    end
    local is_handshake = ty == 0x20 or ty == 0x21
    local path_item = t:add(f.path, tvb(20, 2))
    if is_handshake then
        path_item:append_text(" (READ Depth in CONNECT and ACCEPT, 3.8.1)")
        local d = t:add(f.read_depth, tvb(20, 2))
        if tvb(20, 2):uint() == 0 then
            d:append_text(" (not stated: 16 assumed)")
        end
    end
    t:add(f.payload_len, tvb(22, 2))
    t:add(f.timestamp, tvb(24, 4))
    local name = types[ty] or string.format("UNKNOWN(0x%02x)", ty)
    local psn_label = "psn"
    if meaning == "next PSN" then
        psn_label = "next_psn"
    elseif meaning == "Initial PSN" then
        psn_label = "initial_psn"
    end
    local info = string.format("%s %s=%d %s=%d", name, psn_label, tvb(16, 4):uint(),
        is_handshake and "read_depth" or "path", tvb(20, 2):uint())
    local el = ext_len[ty]
    local plen = tvb(22, 2):uint()
    local prot = protection_len(tvb(2, 2):uint())
    if el == nil or len ~= HEADER_LEN + el + prot + plen + CRC_LEN then
        t:add_proto_expert_info(e_malformed, "unknown type or length mismatch")
        pinfo.cols.info = info .. " [malformed]"
        return len
    end
    t:set_len(len)
    if (ty == 0x20 or ty == 0x21) and tvb(16, 4):uint() ~= tvb(HEADER_LEN + 24, 4):uint() then
        psn_item:add_proto_expert_info(e_psn_field)
    end
    info = info .. dissect_ext(ty, t, tvb, HEADER_LEN, flags)
    if early_data then
        info = info .. " [early]"
    end
    if prot > 0 then
        local so = HEADER_LEN + el
        t:add(f.sec_key_id, tvb(so, 4))
        t:add(f.sec_reserved, tvb(so + 4, 4))
        t:add(f.sec_iv, tvb(so + 8, 8))
        if plen > 0 then t:add(f.ciphertext, tvb(so + SECURITY_LEN, plen)) end
        t:add(f.tag, tvb(so + SECURITY_LEN + plen, TAG_LEN))
        info = info .. string.format(" [protected iv=%s]", tostring(tvb(so + 8, 8):uint64()))
    elseif plen > 0 then
        t:add(f.payload, tvb(HEADER_LEN + el, plen))
    end
    local crc_off = len - CRC_LEN
    local want = tvb(crc_off, 4):uint()
    local got = crc32(tvb, 0, crc_off)
    t:add(f.crc, tvb(crc_off, 4))
    local ok = (got == want)
    t:add(f.crc_ok, tvb(crc_off, 4), ok)
    if not ok then
        t:add_proto_expert_info(e_bad_crc, string.format("computed 0x%08x", got))
        info = info .. " [bad CRC]"
    end
    pinfo.cols.info = info
    return len
end

local function heuristic(tvb, pinfo, tree)
    if not plausible(tvb) then return false end
    metaroce.dissector(tvb, pinfo, tree)
    return true
end

DissectorTable.get("udp.port"):add(pref_port, metaroce)
metaroce:register_heuristic("udp", heuristic)

function metaroce.prefs_changed()
    if metaroce.prefs.port ~= pref_port then
        DissectorTable.get("udp.port"):remove(pref_port, metaroce)
        pref_port = metaroce.prefs.port
        DissectorTable.get("udp.port"):add(pref_port, metaroce)
    end
end
