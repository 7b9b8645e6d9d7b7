//! What the probes need of the kernel, and which kernel brought it: a map the kernel cannot
//! create or a program its verifier refuses for want of a feature is reported as "this kernel
//! (5.10.0) lacks task-local storage for tracing programs (Linux 5.13+)" instead of a verifier
//! dump, by `--config.check` and at start alike. (docs/operations.md, "Supported kernels and
//! architectures", lists the same features.)

/// A kernel feature the probes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFeature {
    pub(crate) name: &'static str,
    /// The first Linux version that has it.
    pub(crate) since: &'static str,
}

pub(crate) const TASK_STORAGE: KernelFeature = KernelFeature {
    name: "task-local storage maps (BPF_MAP_TYPE_TASK_STORAGE)",
    since: "5.11",
};
pub(crate) const TASK_STORAGE_FROM_TRACING: KernelFeature = KernelFeature {
    name: "task-local storage for tracing programs (bpf_task_storage_get outside BPF LSM)",
    since: "5.13",
};
pub(crate) const TASK_BTF: KernelFeature = KernelFeature {
    name: "the current task as a BTF pointer (bpf_get_current_task_btf)",
    since: "5.11",
};
pub(crate) const RING_BUFFER: KernelFeature = KernelFeature {
    name: "BPF ring buffers (BPF_MAP_TYPE_RINGBUF)",
    since: "5.8",
};

/// An argument of a BTF tracepoint that the kernel gave it later than the tracepoint itself;
/// `None` for the tracepoints whose prototypes the probes read have not grown.
fn tracepoint_argument(tracepoint: &str) -> Option<KernelFeature> {
    match tracepoint {
        "sched_switch" => Some(KernelFeature {
            name: "the sched_switch tracepoint's prev_state argument",
            since: "5.18",
        }),
        _ => None,
    }
}

/// The feature a map needs, for the maps whose type is newer than the rest.
pub(crate) fn of_map(map: &str) -> Option<KernelFeature> {
    match map {
        "SYSCALL_THREADS" => Some(TASK_STORAGE),
        "SLOW_EVENTS" | "TRACE_EVENTS" | "TRACE_BLOCK_EVENTS" => Some(RING_BUFFER),
        _ => None,
    }
}

/// The feature a verifier log says is missing: a helper this kernel does not know, or does
/// not allow in this program type.
pub(crate) fn of_verifier_log(log: &str) -> Option<KernelFeature> {
    let refused = |helper: &str| {
        log.lines().any(|l| {
            l.contains(helper) && (l.contains("unknown func") || l.contains("cannot use helper"))
        })
    };
    // A BTF tracepoint's argument that this kernel's prototype lacks: "func 'sched_switch'
    // doesn't have 4-th argument" (some kernels name the `btf_trace_` typedef).
    let missing_argument = log.lines().find_map(|l| {
        let (_, rest) = l.split_once("func '")?;
        let (func, rest) = rest.split_once('\'')?;
        (rest.contains("doesn't have") && rest.contains("argument"))
            .then(|| func.trim_start_matches("btf_trace_"))
    });
    if let Some(tracepoint) = missing_argument {
        tracepoint_argument(tracepoint)
    } else if refused("bpf_task_storage_get") || refused("bpf_task_storage_delete") {
        Some(TASK_STORAGE_FROM_TRACING)
    } else if refused("bpf_get_current_task_btf") {
        Some(TASK_BTF)
    } else if refused("bpf_ringbuf_") {
        Some(RING_BUFFER)
    } else {
        None
    }
}

/// Whether kernel release `release` (`uname -r`: "6.1.0-27-cloud-amd64", "5.15.135") is
/// Linux `major.minor` or later; `None` when the release does not start with a version.
pub(crate) fn release_at_least(release: &str, major: u32, minor: u32) -> Option<bool> {
    let mut parts = release.split(['.', '-', '+']);
    let have_major: u32 = parts.next()?.parse().ok()?;
    let have_minor: u32 = parts.next()?.parse().ok()?;
    Some((have_major, have_minor) >= (major, minor))
}

/// The running kernel's release (`uname -r`).
pub(crate) fn running_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Fault injection for tests and drills: a program named here (`program=feature`, feature
/// `task_storage`) fails to load as on a kernel without that feature, with the verifier's own
/// words, so the explanation path runs end to end.
pub const FAULT_ENV: &str = "SYSSCOPE_FAULT_KERNEL_FEATURE";

/// The verifier log an old kernel writes for `program`, if the fault injection asks for it.
pub(crate) fn injected_verifier_log(program: &str) -> Option<String> {
    let spec = std::env::var(FAULT_ENV).ok()?;
    spec.split(',').find_map(|item| {
        let (p, feature) = item.trim().split_once('=')?;
        (p == program && feature == "task_storage").then(|| {
            "0: R1=ctx() R10=fp0\n; sys_enter\n\
             12: (85) call bpf_task_storage_get#156\n\
             program of this type cannot use helper bpf_task_storage_get#156\n\
             processed 12 insns (limit 1000000)"
                .to_string()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_logs_of_older_kernels_name_the_feature() {
        // 5.10: task storage exists for BPF LSM only.
        let log = "12: (85) call bpf_task_storage_get#156\n\
                   program of this type cannot use helper bpf_task_storage_get#156";
        assert_eq!(of_verifier_log(log), Some(TASK_STORAGE_FROM_TRACING));
        // Before 5.11: the helper is unknown altogether.
        assert_eq!(
            of_verifier_log("unknown func bpf_get_current_task_btf#158"),
            Some(TASK_BTF)
        );
        assert_eq!(
            of_verifier_log("unknown func bpf_ringbuf_reserve#131"),
            Some(RING_BUFFER)
        );
        // 5.13-5.17: sched_switch has three arguments.
        let log = "func 'sched_switch' doesn't have 4-th argument\n\
                   invalid bpf_context access off=24 size=8";
        let feature = of_verifier_log(log).unwrap();
        assert!(feature.name.contains("sched_switch"), "{feature:?}");
        assert_eq!(feature.since, "5.18");
        assert_eq!(
            of_verifier_log("func 'btf_trace_block_rq_issue' doesn't have 3-th argument"),
            None
        );
        // A verifier refusal for another reason is not blamed on the kernel's age.
        assert_eq!(of_verifier_log("R1 invalid mem access 'scalar'"), None);
        assert_eq!(of_map("SYSCALL_THREADS"), Some(TASK_STORAGE));
        assert_eq!(of_map("SYSCALL_STATS"), None);
    }

    #[test]
    fn releases_compare_by_major_and_minor() {
        assert_eq!(release_at_least("6.4.0", 6, 4), Some(true));
        assert_eq!(release_at_least("6.18.0-rc1+", 6, 4), Some(true));
        assert_eq!(release_at_least("6.1.0-27-cloud-amd64", 6, 4), Some(false));
        assert_eq!(release_at_least("5.15.135", 6, 2), Some(false));
        assert_eq!(release_at_least("10.0", 6, 4), Some(true));
        assert_eq!(release_at_least("unknown", 6, 4), None);
    }
}
