//! Reading the key = value vector files of `compliance/vectors/` (their
//! format: `compliance/vectors/README.md`), shared by the tests of the
//! protected and the early vectors.

#![allow(dead_code)] // each test uses the accessors it needs

use std::collections::BTreeMap;
use std::fs;
use std::net::IpAddr;
use std::path::PathBuf;

use smoltcp::wire::IpAddress;

/// One vector file: its name and its fields.
pub struct Vector {
    pub name: String,
    kv: BTreeMap<String, String>,
}

impl Vector {
    pub fn str(&self, k: &str) -> &str {
        self.kv
            .get(k)
            .unwrap_or_else(|| panic!("{}: no `{k}`", self.name))
    }
    pub fn has(&self, k: &str) -> bool {
        self.kv.contains_key(k)
    }
    pub fn hex(&self, k: &str) -> Vec<u8> {
        let s = self.str(k);
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }
    pub fn int(&self, k: &str) -> u64 {
        let s = self.str(k);
        match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).expect("hex int"),
            None => s.parse().expect("int"),
        }
    }
    pub fn array<const N: usize>(&self, k: &str) -> [u8; N] {
        self.hex(k).try_into().expect("length")
    }
    pub fn ip(&self, k: &str) -> IpAddress {
        let a: IpAddr = self.str(k).parse().expect("address");
        IpAddress::from(a)
    }
}

/// Every `.vec` file of `compliance/vectors/<dir>`, in name order.
pub fn load(dir: &str) -> Vec<Vector> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../compliance/vectors")
        .join(dir);
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "vec"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = fs::read_to_string(p).unwrap();
            let kv = text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .map(|l| {
                    let (k, v) = l.split_once('=').expect("key = value");
                    (k.trim().to_string(), v.trim().to_string())
                })
                .collect::<BTreeMap<_, _>>();
            Vector {
                name: kv["name"].clone(),
                kv,
            }
        })
        .collect()
}
