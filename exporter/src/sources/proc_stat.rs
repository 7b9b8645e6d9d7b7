//! `/proc/stat`: the ticks (USER_HZ) every CPU, and the node as a whole, spent in each mode
//! since boot. Read by the CPU collector (`sysscope_cpu_utilization_ratio`) and by
//! `sysscope trace`'s CPU counter tracks.
//!
//! Parsed here rather than through `procfs`, whose `KernelStats` keeps CPUs by position and so
//! mislabels every CPU after an offline one: a CPU keeps its kernel number here, and an
//! offline CPU is simply absent.

use std::path::Path;

/// Where the kernel publishes it.
pub(crate) const PATH: &str = "/proc/stat";

/// Modes in the order of the columns after the CPU name.
pub(crate) const MODES: [&str; 8] = [
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
];

#[derive(Debug, thiserror::Error)]
pub enum ProcStatError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: {problem}")]
    Parse {
        path: String,
        line: usize,
        problem: String,
    },
}

/// Ticks one CPU (or the node) spent in each mode since boot, in [`MODES`] order.
///
/// `/proc/stat` also has `guest` and `guest_nice`, but the kernel already counts guest time
/// in `user` and `nice`: adding them would count it twice, so they are not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CpuTicks(pub(crate) [u64; 8]);

impl CpuTicks {
    /// The ticks of each mode since `prev`, an earlier read. A counter that went back (idle
    /// and iowait can, briefly, on tickless kernels) contributes 0.
    pub(crate) fn since(&self, prev: &CpuTicks) -> [u64; 8] {
        let mut delta = [0u64; 8];
        for (d, (c, p)) in delta.iter_mut().zip(self.0.iter().zip(prev.0.iter())) {
            *d = c.saturating_sub(*p);
        }
        delta
    }
}

/// One read of `/proc/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// The `cpu` line: every CPU together.
    pub(crate) total: Option<CpuTicks>,
    /// The `cpuN` lines, by CPU number, in file order.
    pub(crate) cpus: Vec<(u32, CpuTicks)>,
}

/// Reads and parses the file at `path`.
pub(crate) fn read(path: &Path) -> Result<ProcStat, ProcStatError> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ProcStatError::Read {
        path: display.clone(),
        source,
    })?;
    parse(&text, &display)
}

/// Parses `/proc/stat` text; `path` names it in errors. Columns a kernel does not have
/// (iowait before 2.5.41, steal before 2.6.11) read as 0; a file without per-CPU lines is an
/// error.
pub(crate) fn parse(text: &str, path: &str) -> Result<ProcStat, ProcStatError> {
    let mut stat = ProcStat {
        total: None,
        cpus: Vec::new(),
    };
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.strip_prefix("cpu") else {
            continue;
        };
        let parse_err = |problem: String| ProcStatError::Parse {
            path: path.to_string(),
            line: i + 1,
            problem,
        };
        // "cpu  ..." (the total) has no number: its name ends at the first space.
        let (cpu, columns) = match rest.split_once(|c: char| c.is_ascii_whitespace()) {
            Some(("", columns)) => (None, columns),
            Some((number, columns)) => (Some(number), columns),
            None => continue,
        };
        let cpu = cpu
            .map(|n| {
                n.parse::<u32>()
                    .map_err(|_| parse_err(format!("`cpu{n}` is not a CPU number")))
            })
            .transpose()?;
        let mut ticks = [0u64; 8];
        let mut n = 0;
        for (slot, field) in ticks.iter_mut().zip(columns.split_ascii_whitespace()) {
            *slot = field
                .parse()
                .map_err(|_| parse_err(format!("`{field}` is not a tick count")))?;
            n += 1;
        }
        if n < 4 {
            let name = cpu.map_or_else(|| "cpu".to_string(), |c| format!("cpu{c}"));
            return Err(parse_err(format!(
                "{name} has {n} columns, expected at least 4"
            )));
        }
        match cpu {
            Some(cpu) => stat.cpus.push((cpu, CpuTicks(ticks))),
            None => stat.total = Some(CpuTicks(ticks)),
        }
    }
    if stat.cpus.is_empty() {
        return Err(ProcStatError::Parse {
            path: path.to_string(),
            line: 0,
            problem: "no per-CPU lines".into(),
        });
    }
    Ok(stat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_keep_their_numbers_and_columns_are_checked() {
        // CPU 2 offline: cpu3 is still CPU 3. Guest columns are not read.
        let stat = parse(
            "cpu  33 0 10 95 0 0 0 0 0 0\ncpu0 32780 0 10243 95460 632 0 33 21 7 0\n\
             cpu1 5 0 5 90 0 0 0 0 0 0\ncpu3 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n",
            "stat",
        )
        .unwrap();
        assert_eq!(stat.total, Some(CpuTicks([33, 0, 10, 95, 0, 0, 0, 0])));
        let numbers: Vec<u32> = stat.cpus.iter().map(|(n, _)| *n).collect();
        assert_eq!(numbers, [0, 1, 3]);
        assert_eq!(
            stat.cpus[0].1,
            CpuTicks([32780, 0, 10243, 95460, 632, 0, 33, 21])
        );
        assert_eq!(stat.cpus[2].1, CpuTicks([1, 2, 3, 4, 5, 6, 7, 8]));
        // Missing columns (old kernels) read as 0.
        let stat = parse("cpu 1 2 3 4\ncpu0 1 2 3 4\n", "stat").unwrap();
        assert_eq!(stat.cpus, [(0, CpuTicks([1, 2, 3, 4, 0, 0, 0, 0]))]);
    }

    #[test]
    fn malformed_files_are_named_with_their_line() {
        let e = parse("cpu 1 2 3 4\ncpu0 1 x 3 4\n", "/proc/stat").unwrap_err();
        assert_eq!(e.to_string(), "/proc/stat line 2: `x` is not a tick count");
        let e = parse("cpu0 1 2\n", "s").unwrap_err();
        assert_eq!(
            e.to_string(),
            "s line 1: cpu0 has 2 columns, expected at least 4"
        );
        let e = parse("cpux 1 2 3 4\n", "s").unwrap_err();
        assert_eq!(e.to_string(), "s line 1: `cpux` is not a CPU number");
        assert!(parse("intr 1\n", "s").is_err());
    }

    #[test]
    fn ticks_since_an_earlier_read_never_go_negative() {
        let prev = CpuTicks([20, 0, 10, 62, 0, 0, 0, 0]);
        let cur = CpuTicks([30, 0, 10, 60, 0, 0, 0, 0]);
        assert_eq!(cur.since(&prev), [10, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn this_machine_has_cpus() {
        let stat = read(Path::new(PATH)).unwrap();
        assert!(!stat.cpus.is_empty() && stat.total.is_some());
    }
}
