//! Packet protection on the host (spec 5.3): the pre-shared key from a
//! file, the policy from the command line, and what the summaries show.

use std::path::Path;

use metaroce_core::crypto::{Policy, ProtectionStats, PSK_LEN};
use metaroce_core::wire::CipherSuite;
use serde_json::{Map, Value};

use crate::HostError;

/// A node's protection: its policy and the one pre-shared key it holds.
#[derive(Clone, PartialEq, Eq)]
pub struct Protection {
    pub policy: Policy,
    /// The Key ID the key is installed (and offered) under.
    pub key_id: u32,
    pub psk: [u8; PSK_LEN],
}

impl std::fmt::Debug for Protection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Protection")
            .field("policy", &self.policy)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// Reads a pre-shared key: a file of 64 hexadecimal digits (white space
/// around them ignored) or of exactly 32 raw bytes.
pub fn read_psk_file(path: &Path) -> Result<[u8; PSK_LEN], HostError> {
    let bytes = std::fs::read(path)
        .map_err(|e| HostError::Usage(format!("--psk-file {}: {e}", path.display())))?;
    parse_psk(&bytes).ok_or_else(|| {
        HostError::Usage(format!(
            "--psk-file {}: expected 64 hexadecimal digits or 32 raw bytes, got {} bytes",
            path.display(),
            bytes.len()
        ))
    })
}

/// See [`read_psk_file`].
pub fn parse_psk(bytes: &[u8]) -> Option<[u8; PSK_LEN]> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let t = text.trim();
        if t.len() == 2 * PSK_LEN && t.bytes().all(|b| b.is_ascii_hexdigit()) {
            let mut k = [0u8; PSK_LEN];
            for (i, k) in k.iter_mut().enumerate() {
                *k = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).ok()?;
            }
            return Some(k);
        }
    }
    bytes.try_into().ok()
}

/// A policy's name on the command line.
pub fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Off => "off",
        Policy::Allow => "allow",
        Policy::Require => "require",
    }
}

/// A connection's protection as the summaries print it.
pub fn suite_name(suite: CipherSuite, key_id: u32) -> String {
    match suite {
        CipherSuite::None => "none".into(),
        CipherSuite::Aes256Gcm => format!("AES_256_GCM key {key_id}"),
    }
}

/// Every protection counter as JSON.
pub fn json(s: &ProtectionStats) -> Value {
    let mut m = Map::new();
    for (k, v) in s.by_reason() {
        m.insert(k.into(), Value::from(v));
    }
    Value::Object(m)
}

/// `sealed N, opened N, auth_failed N, replayed N, ...`: packets sealed and
/// opened, then the drops and refusals that counted anything.
pub fn line(s: &ProtectionStats) -> String {
    let mut parts = vec![
        format!("sealed {}", s.sealed),
        format!("opened {}", s.opened),
        format!("auth_failed {}", s.auth_failed),
        format!("replayed {}", s.replayed),
    ];
    for (k, v) in s.by_reason() {
        if v > 0 && !matches!(k, "sealed" | "opened" | "auth_failed" | "replayed") {
            parts.push(format!("{k} {v}"));
        }
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_from_hex_or_raw_bytes() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n";
        let k = parse_psk(hex.as_bytes()).unwrap();
        assert_eq!(k[1], 0x11);
        assert_eq!(k[31], 0xff);
        assert_eq!(parse_psk(&[7u8; 32]), Some([7u8; 32]));
        assert_eq!(parse_psk(b"0011"), None);
        assert_eq!(parse_psk(&[7u8; 33]), None);
        let p = Protection {
            policy: Policy::Require,
            key_id: 1,
            psk: [0xab; 32],
        };
        assert!(!format!("{p:?}").contains("171"), "no key in Debug");
    }
}
