//! The markdown every section of the report is written with: numbers,
//! milliseconds and tables. A leaf: it imports nothing of this crate, so
//! each scenario module can render its own section with it.

use std::fmt::Write as _;

/// A number with sensible precision: 3 significant digits below 1000,
/// thousands separated above.
pub(crate) fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        let mut digits = format!("{a:.0}");
        let mut out = String::new();
        while digits.len() > 3 {
            let tail = digits.split_off(digits.len() - 3);
            out = format!(",{tail}{out}");
        }
        format!("{}{digits}{out}", if v < 0.0 { "-" } else { "" })
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3}")
    }
}

/// Microseconds shown in ms.
pub(crate) fn ms(us: f64) -> String {
    num(us / 1000.0)
}

/// A markdown table.
pub(crate) fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", head.iter().map(|_| "---|").collect::<String>());
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(num(0.0), "0");
        assert_eq!(num(0.01234), "0.012");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(123.4), "123");
        assert_eq!(num(61_234.0), "61,234");
        assert_eq!(num(1_234_567.0), "1,234,567");
        assert_eq!(num(-2_500.0), "-2,500");
        assert_eq!(num(f64::NAN), "n/a");
        assert_eq!(ms(1_500.0), "1.50");
    }

    #[test]
    fn tables_are_markdown() {
        let t = table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }
}
