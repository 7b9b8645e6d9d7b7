//! Collector switches on the command line, as node_exporter spells them: `--collector.<name>`
//! turns a collector on and `--no-collector.<name>` off, whatever the configuration file says.
//! Each maps onto one key of the file ([`COLLECTORS`]; `Config::apply_collector_flags` sets
//! it), so `--config.check`, the reload's comparison and the docs speak of the same key; the
//! flags are applied after every load of the file, the reloads' included, so a reload never
//! sees them as a change.

/// Each collector's name (its `sysscope_collector_up{collector}` value and flag suffix) and
/// the key of the configuration file the flag sets.
pub const COLLECTORS: &[(&str, &str)] = &[
    ("syscalls", "syscalls.enabled"),
    ("block_io", "block_io.enabled"),
    ("cpu", "cpu.enabled"),
    ("gpu", "gpu.enabled"),
    ("kubernetes", "kubernetes.pod_watch"),
];

/// `--collector.<name>` and `--no-collector.<name>` for every collector of [`COLLECTORS`]. Of
/// two contradicting flags the last one given wins, as with node_exporter.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Collectors (each flag wins over its key in --config.file)")]
pub struct CollectorFlags {
    /// Enable the syscall collector (syscalls.enabled = true).
    #[arg(long = "collector.syscalls", overrides_with = "no_syscalls")]
    syscalls: bool,
    /// Disable the syscall collector, and with it the slow-call spans it feeds.
    #[arg(long = "no-collector.syscalls", overrides_with = "syscalls")]
    no_syscalls: bool,
    /// Enable the block I/O collector (block_io.enabled = true).
    #[arg(long = "collector.block_io", overrides_with = "no_block_io")]
    block_io: bool,
    /// Disable the block I/O collector.
    #[arg(long = "no-collector.block_io", overrides_with = "block_io")]
    no_block_io: bool,
    /// Enable the CPU collector (cpu.enabled = true).
    #[arg(long = "collector.cpu", overrides_with = "no_cpu")]
    cpu: bool,
    /// Disable the CPU collector.
    #[arg(long = "no-collector.cpu", overrides_with = "cpu")]
    no_cpu: bool,
    /// Enable the GPU collector (gpu.enabled = true).
    #[arg(long = "collector.gpu", overrides_with = "no_gpu")]
    gpu: bool,
    /// Disable the GPU collector (e.g. beside dcgm-exporter).
    #[arg(long = "no-collector.gpu", overrides_with = "gpu")]
    no_gpu: bool,
    /// Watch this node's pods for namespace/pod/container labels (kubernetes.pod_watch = "on").
    #[arg(long = "collector.kubernetes", overrides_with = "no_kubernetes")]
    kubernetes: bool,
    /// No pod watch (kubernetes.pod_watch = "off"); pod_uid/container_id stay.
    #[arg(long = "no-collector.kubernetes", overrides_with = "kubernetes")]
    no_kubernetes: bool,
}

impl CollectorFlags {
    /// The switch given for each collector named on the command line: (name, on).
    pub fn switches(&self) -> Vec<(&'static str, bool)> {
        let pairs = [
            ("syscalls", self.syscalls, self.no_syscalls),
            ("block_io", self.block_io, self.no_block_io),
            ("cpu", self.cpu, self.no_cpu),
            ("gpu", self.gpu, self.no_gpu),
            ("kubernetes", self.kubernetes, self.no_kubernetes),
        ];
        pairs
            .into_iter()
            .filter(|(_, on, off)| *on || *off)
            .map(|(name, on, _)| (name, on))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::Config;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        flags: CollectorFlags,
    }

    fn parse(args: &[&str]) -> CollectorFlags {
        Cli::try_parse_from(std::iter::once("sysscope").chain(args.iter().copied()))
            .unwrap()
            .flags
    }

    #[test]
    fn flags_win_over_the_file_and_the_last_one_wins() {
        let text = "[gpu]\nenabled = false\n[block_io]\nenabled = true\n\
                    [kubernetes]\npod_watch = \"auto\"\n";
        let mut config = Config::parse(text, "test.toml").unwrap();
        let flags = parse(&[
            "--collector.gpu",
            "--no-collector.block_io",
            "--collector.cpu",
            "--no-collector.cpu",
            "--no-collector.kubernetes",
        ]);
        assert_eq!(
            flags.switches(),
            [
                ("block_io", false),
                ("cpu", false),
                ("gpu", true),
                ("kubernetes", false)
            ]
        );
        config.apply_collector_flags(&flags);
        assert!(config.gpu.enabled);
        assert!(!config.block_io.enabled);
        assert!(!config.cpu.enabled);
        assert!(config.syscalls.enabled, "not named: the file's value stays");
        assert_eq!(config.kubernetes.pod_watch, "off");
        config.apply_collector_flags(&parse(&["--collector.kubernetes"]));
        assert_eq!(config.kubernetes.pod_watch, "on");
        // Applying the same flags to the same file changes nothing a reload would see.
        let mut again = Config::parse(text, "test.toml").unwrap();
        again.apply_collector_flags(&flags);
        again.apply_collector_flags(&parse(&["--collector.kubernetes"]));
        assert!(crate::config::changed_keys(&config, &again).is_empty());
    }

    #[test]
    fn every_collector_has_both_flags_and_a_key() {
        for (name, key) in COLLECTORS {
            let on = parse(&[&format!("--collector.{name}")]);
            let off = parse(&[&format!("--no-collector.{name}")]);
            assert_eq!(on.switches(), [(*name, true)]);
            assert_eq!(off.switches(), [(*name, false)]);
            let (mut a, mut b) = (Config::default(), Config::default());
            a.apply_collector_flags(&on);
            b.apply_collector_flags(&off);
            assert_eq!(crate::config::changed_keys(&a, &b), [key.to_string()]);
        }
        assert!(Cli::try_parse_from(["sysscope", "--collector.nope"]).is_err());
        assert!(parse(&[]).switches().is_empty());
    }
}
