//! Reading the kernel's small pseudo-files: cgroup `cpu.stat` and `cgroup.stat` cheaply, the
//! host name.

use std::path::Path;

/// Reads a small pseudo-file in one `read` (open, read, close: `read_to_string` also stats
/// the file and reads again for the end, which per cgroup adds up) into `buf`, growing it when
/// the file fills it.
pub(crate) fn read_small<'a>(path: &Path, buf: &'a mut Vec<u8>) -> Option<&'a str> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = 0;
    loop {
        let n = file.read(&mut buf[len..]).ok()?;
        len += n;
        if n == 0 || len < buf.len() {
            break;
        }
        buf.resize(buf.len() * 2, 0);
    }
    std::str::from_utf8(&buf[..len]).ok()
}

/// This machine's host name (what `uname -n` prints); empty if unreadable.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
