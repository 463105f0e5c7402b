//! Decoding a node's defmt stream with the tables in its ELF.

use defmt_decoder::{DecodeError, Table};

/// Decodes `bytes` into text lines (`timestamp LEVEL message`). Errors in
/// the ELF are returned; a malformed frame is reported in the output and
/// decoding resumes where the encoding allows.
pub fn decode(elf: &[u8], bytes: &[u8]) -> Result<Vec<String>, String> {
    let table = Table::parse(elf)
        .map_err(|e| format!("reading defmt table: {e}"))?
        .ok_or("the ELF has no defmt table")?;
    let mut decoder = table.new_stream_decoder();
    decoder.received(bytes);
    let mut lines = Vec::new();
    loop {
        match decoder.decode() {
            Ok(frame) => {
                let ts = frame
                    .display_timestamp()
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                let level = frame
                    .level()
                    .map(|l| l.as_str().to_uppercase())
                    .unwrap_or_default();
                lines.push(format!("{ts:>12} {level:<5} {}", frame.display_message()));
            }
            Err(DecodeError::UnexpectedEof) => break,
            Err(DecodeError::Malformed) => {
                lines.push("(malformed defmt frame)".to_owned());
                if !table.encoding().can_recover() {
                    break;
                }
            }
        }
    }
    Ok(lines)
}
