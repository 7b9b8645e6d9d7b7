//! What the scheduler programs (`ebpf/probes/src/sched.rs`) and the syscall entry's identity
//! read need of the running kernel, set in the global `SCHED_CONFIG` at load: where a
//! switched-out task's state is (`__state` or `state`, from BTF), whether task storage may be
//! created under the runqueue lock (6.4+) and whether a lookup may fail though the value
//! exists (before 6.2), from the release, and where a 32-bit call's `TS_COMPAT` mark is.

use sysscope_abi::{SchedProbeConfig, NO_FIELD};

use crate::kernel::{
    btf::{Btf, BtfError, MemberKind},
    features,
};

/// What the scheduler programs need of the running kernel (global `SCHED_CONFIG`): where a
/// task's state is (`task_state`: its offset and size, from [`resolve_task_state`]; `None`
/// when it could not be found), and from the release whether task storage may be created
/// under the runqueue lock (6.4+) and whether a lookup may fail though the value exists
/// (before 6.2). An unreadable release gets the answers safe on every kernel.
pub(crate) fn sched_config(task_state: Option<(u32, u32)>, release: &str) -> SchedProbeConfig {
    let (offset, bytes) = task_state.unwrap_or((NO_FIELD, 0));
    SchedProbeConfig {
        task_state: offset,
        task_state_bytes: bytes,
        create_in_switch: u32::from(features::release_at_least(release, 6, 4) == Some(true)),
        lookup_may_fail: u32::from(features::release_at_least(release, 6, 2) != Some(true)),
        // Set by the loader on x86_64 ([`resolve_compat_status`]).
        compat_status: NO_FIELD,
    }
}

/// The offset and size of a task's state in `struct task_struct`: `__state` (an `unsigned
/// int`, 5.14+) or `state` (a `long`, before).
pub(crate) fn resolve_task_state(btf: &Btf) -> Result<(u32, u32), BtfError> {
    match btf.field_of_kind("task_struct", "__state", MemberKind::Int(4)) {
        Ok(offset) => Ok((offset, 4)),
        Err(new) => btf
            .field_of_kind("task_struct", "state", MemberKind::Int(8))
            .map(|offset| (offset, 8))
            .map_err(|_| new),
    }
}

/// x86_64: the offset of `thread_info.status` in `struct task_struct` (`thread_info` is
/// embedded with `THREAD_INFO_IN_TASK`), whose `TS_COMPAT` bit marks a 32-bit call in
/// progress. The probes read it only when a CPU's identity is read.
pub(crate) fn resolve_compat_status(btf: &Btf) -> Result<u32, BtfError> {
    let thread_info = btf.struct_field("task_struct", "thread_info")?;
    let status = btf.field_of_kind("thread_info", "status", MemberKind::Int(4))?;
    Ok(thread_info + status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compat_status_resolves_on_this_kernel() {
        let Some(btf) = crate::kernel::btf::for_test("the_compat_status_resolves_on_this_kernel")
        else {
            return;
        };
        if cfg!(target_arch = "x86_64") {
            // 5.11+: `flags`, `syscall_work`, then `u32 status`, at the start of the task.
            assert_eq!(resolve_compat_status(&btf).unwrap(), 16);
        }
    }

    #[test]
    fn the_task_state_resolves_on_this_kernel() {
        let Some(btf) = crate::kernel::btf::for_test("the_task_state_resolves_on_this_kernel")
        else {
            return;
        };
        // 6.18: `unsigned int __state`.
        let (offset, bytes) = resolve_task_state(&btf).unwrap();
        assert_eq!(bytes, 4);
        assert_ne!(offset, NO_FIELD);
    }

    #[test]
    fn task_storage_is_created_in_the_scheduler_from_6_4_only() {
        let on = |release| {
            let c = sched_config(Some((24, 4)), release);
            (c.create_in_switch, c.lookup_may_fail)
        };
        assert_eq!(on("6.18.0"), (1, 0));
        assert_eq!(on("6.4.0-rc2"), (1, 0));
        assert_eq!(on("6.3.13"), (0, 0));
        assert_eq!(on("6.2.0"), (0, 0));
        assert_eq!(on("6.1.0-27-cloud-amd64"), (0, 1));
        assert_eq!(on("5.15.135"), (0, 1));
        assert_eq!(on("unknown"), (0, 1));
        let unset = sched_config(None, "6.18.0");
        assert_eq!((unset.task_state, unset.task_state_bytes), (NO_FIELD, 0));
    }
}
