//! Units for people: durations as the tools print them.

/// A duration in ns, readable: "850 ns", "12.3 µs", "4.56 ms", "1.23 s".
pub(crate) fn secs(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}
