//! Plain-text tables for people: columns padded to their widest cell.

/// Renders `rows` under `header`, two spaces between columns.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(cell);
            l.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_line_up_under_the_widest_cell() {
        let t = super::render(
            &["ID", "DEVICE"],
            &[
                vec!["1".into(), "press-7".into()],
                vec!["12".into(), "a".into()],
            ],
        );
        assert_eq!(t, "ID  DEVICE\n1   press-7\n12  a\n");
    }
}
