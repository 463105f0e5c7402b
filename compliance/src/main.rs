//! MetaRoCE compliance suite (being built).

fn main() {}
