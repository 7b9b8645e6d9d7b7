//! The text form of a diagnosis: an overview of the target, its top syscalls, and the verdicts
//! with their evidence and fixes.

use super::{features::*, rules::*};
use crate::cli::{measure::Measurement, progress::thousands, render::units::secs};

/// The overview lines above the verdicts.
pub(super) fn overview(c: &Context, m: Option<&Measurement>, target: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let total = c.profile.total_ns() as f64;
    let wall = c.wall.as_nanos() as f64;
    lines.push(format!("sysscope diagnose: {target}, {} wall", secs(wall)));
    let mut s = format!(
        "{} syscalls ({} failed), {} inside them",
        thousands(c.profile.total_calls()),
        thousands(c.profile.total_errors()),
        secs(total)
    );
    if wall > 0.0 && total / wall >= 1.5 {
        s.push_str(&format!(
            " ({:.1}x wall: several threads at once)",
            total / wall
        ));
    }
    s.push_str(&format!(
        ", {} process(es)",
        thousands(c.profile.processes.len() as u64)
    ));
    if let Some(f) = c.features {
        s.push_str(&format!(
            ", {} thread(s)",
            thousands(f.threads.len() as u64)
        ));
    }
    lines.push(s);
    let wait = c.time_ns(WAIT_CHILD);
    if wait > 0 && total > 0.0 && wait as f64 / total >= 0.2 {
        lines.push(format!(
            "{} of wait4/waitid (parents waiting for their children) are left out of the \
             shares below; the children's own calls are counted",
            secs(wait as f64)
        ));
    }
    if let Some(m) = m {
        if m.drops.trace_ring_buffer_full > 0 {
            lines.push(format!(
                "note: {} per-call records were lost (ring buffer full); counts are exact, \
                 per-call evidence is sampled",
                thousands(m.drops.trace_ring_buffer_full)
            ));
        }
    }
    lines
}

/// The top syscalls by time, for the footer: "futex 92.1%, read 5.0%".
pub(super) fn top_syscalls(c: &Context, n: usize) -> String {
    let active = c.active_ns().max(1) as f64;
    let mut rows: Vec<_> = c
        .profile
        .rows
        .values()
        .filter(|r| r.calls > 0 && !WAIT_CHILD.contains(&r.name.as_str()))
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.total_ns));
    rows.iter()
        .take(n)
        .map(|r| format!("{} {:.1}%", r.name, r.total_ns as f64 * 100.0 / active))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The diagnosis as text.
pub(crate) fn render_text(
    c: &Context,
    verdicts: &[Verdict],
    m: Option<&Measurement>,
    target: &str,
) -> String {
    let mut out = String::new();
    for l in overview(c, m, target) {
        out.push_str(&l);
        out.push('\n');
    }
    out.push('\n');
    if verdicts.is_empty() {
        out.push_str(
            "No known pattern stands out: syscall time is spread out, or too small to matter.\n",
        );
    }
    for (i, v) in verdicts.iter().enumerate() {
        out.push_str(&format!("{}. [{}] {}\n", i + 1, v.id, v.title));
        out.push_str("   evidence:\n");
        for e in &v.evidence {
            out.push_str(&format!("     - {e}\n"));
        }
        out.push_str(&format!("   fix: {}\n\n", v.fix));
    }
    if c.profile.total_calls() > 0 {
        out.push_str(&format!("top syscalls by time: {}\n", top_syscalls(c, 6)));
    }
    out
}
