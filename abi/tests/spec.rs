//! The specification's layout tables (`docs/spec/06-host-interface.md`,
//! §6.9) match the compiled structures ([`metaroce_abi::LAYOUTS`]) field by
//! field: name, offset and size, and each structure's total size.

use std::path::Path;

use metaroce_abi::LAYOUTS;

/// One field row of a spec table: offset, size, name.
type Row = (usize, usize, String);
/// One spec table: the C name, the size, the rows.
type Table = (String, usize, Vec<Row>);

/// The table under each `#### \`name\` (N bytes)` heading.
fn spec_tables(text: &str) -> Vec<Table> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("#### `") else {
            continue;
        };
        let Some((name, rest)) = rest.split_once("` (") else {
            continue;
        };
        let Some(size) = rest.strip_suffix(" bytes)").and_then(|s| s.parse().ok()) else {
            continue;
        };
        let mut fields = Vec::new();
        for row in lines.by_ref() {
            let row = row.trim();
            if row.is_empty() && !fields.is_empty() {
                break;
            }
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            if cells.len() < 5 {
                continue;
            }
            if let (Ok(offset), Ok(size)) = (cells[1].parse(), cells[2].parse()) {
                fields.push((offset, size, cells[3].trim_matches('`').to_owned()));
            }
        }
        out.push((name.to_owned(), size, fields));
    }
    out
}

#[test]
fn spec_tables_match_the_compiled_layout() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/spec/06-host-interface.md");
    let text = std::fs::read_to_string(&path).expect("the spec chapter");
    let tables = spec_tables(&text);
    for layout in LAYOUTS {
        let (_, size, fields) = tables
            .iter()
            .find(|(name, _, _)| name == layout.c_name)
            .unwrap_or_else(|| panic!("{} has no table in {}", layout.c_name, path.display()));
        assert_eq!(*size, layout.size, "{}: size", layout.c_name);
        let code: Vec<Row> = layout
            .fields
            .iter()
            .map(|f| (f.offset, f.size, f.name.to_owned()))
            .collect();
        assert_eq!(
            fields, &code,
            "{}: fields (offset, size, name)",
            layout.c_name
        );
    }
    assert_eq!(tables.len(), LAYOUTS.len(), "a table without a structure");
}
