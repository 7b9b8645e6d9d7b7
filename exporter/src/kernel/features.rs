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
    if refused("bpf_task_storage_get") || refused("bpf_task_storage_delete") {
        Some(TASK_STORAGE_FROM_TRACING)
    } else if refused("bpf_get_current_task_btf") {
        Some(TASK_BTF)
    } else if refused("bpf_ringbuf_") {
        Some(RING_BUFFER)
    } else {
        None
    }
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
        // A verifier refusal for another reason is not blamed on the kernel's age.
        assert_eq!(of_verifier_log("R1 invalid mem access 'scalar'"), None);
        assert_eq!(of_map("SYSCALL_THREADS"), Some(TASK_STORAGE));
        assert_eq!(of_map("SYSCALL_STATS"), None);
    }
}
