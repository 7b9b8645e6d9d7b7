//! A minimal reader of the kernel's BTF (`/sys/kernel/btf/vmlinux`, or the file `--btf.path`
//! names): struct member offsets and enum values, which is what probes written without CO-RE
//! need to read kernel structs whose layout changes between versions and configurations (see
//! `kernel::block_io`, `kernel::fd_class`).
//!
//! Only the type section and the string section are read; members inside anonymous structs
//! and unions are found as if they were direct members, like C does.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::OnceLock,
};

/// Where the running kernel publishes its BTF.
pub(crate) const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The kernel's BTF from another file (`--btf.path`), set once at start.
static KERNEL_BTF_FILE: OnceLock<PathBuf> = OnceLock::new();

/// Reads the kernel's BTF from `path` instead of [`VMLINUX`] from now on (`--btf.path`): for a
/// container that does not see `/sys/kernel/btf`, or a distribution that ships the kernel's BTF
/// as a file. The file is parsed now, so a wrong path or a file that is not BTF is refused at
/// start naming the path. The kernel still needs BTF of its own for the probes' typed pointers
/// (the verifier checks them against it).
pub fn use_kernel_btf_file(path: &Path) -> Result<(), BtfError> {
    Btf::from_file(path)?;
    let _ = KERNEL_BTF_FILE.set(path.to_path_buf());
    Ok(())
}

/// The file sysscope reads the kernel's BTF from.
pub(crate) fn kernel_btf_file() -> &'static Path {
    KERNEL_BTF_FILE
        .get()
        .map_or(Path::new(VMLINUX), PathBuf::as_path)
}

/// The file `--btf.path` named, if any.
pub(crate) fn given_kernel_btf_file() -> Option<&'static Path> {
    KERNEL_BTF_FILE.get().map(PathBuf::as_path)
}

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read kernel BTF {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not BTF: {problem}")]
    NotBtf { path: String, problem: String },
    #[error("kernel BTF is malformed: {0}")]
    Malformed(String),
    #[error("kernel BTF has no struct `{0}`")]
    NoStruct(String),
    #[error("kernel BTF: struct `{strukt}` has no member `{member}`")]
    NoMember { strukt: String, member: String },
    #[error("kernel BTF: `{strukt}.{member}` is {found}, expected {expected}")]
    UnexpectedType {
        strukt: String,
        member: String,
        found: String,
        expected: String,
    },
}

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone)]
struct Member {
    name: u32,
    ty: u32,
    /// Offset in bits from the start of the struct.
    bit_offset: u32,
    /// Non-zero for bitfields.
    bitfield_size: u32,
}

#[derive(Debug, Clone)]
enum Type {
    /// Placeholder for kinds this reader does not look into.
    Other,
    Int {
        size: u32,
    },
    Ptr,
    Array,
    Composite {
        name: u32,
        size: u32,
        members: Vec<Member>,
    },
    Enum {
        name: u32,
        size: u32,
        values: Vec<(u32, i64)>,
    },
    /// typedef, const, volatile, restrict, type tag: refer to another type.
    Alias {
        name: u32,
        ty: u32,
    },
}

/// What a member is, after typedefs and qualifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberKind {
    /// An integer (or enum) of this many bytes.
    Int(u32),
    Pointer,
    Composite(u32),
    Array,
    Other,
}

impl std::fmt::Display for MemberKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemberKind::Int(n) => write!(f, "a {n}-byte integer"),
            MemberKind::Pointer => f.write_str("a pointer"),
            MemberKind::Composite(n) => write!(f, "a {n}-byte struct or union"),
            MemberKind::Array => f.write_str("an array"),
            MemberKind::Other => f.write_str("another kind of type"),
        }
    }
}

/// A struct member as found: byte offset from the start of the outer struct, and its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) offset: u32,
    pub(crate) kind: MemberKind,
}

/// Parsed kernel BTF.
#[derive(Debug)]
pub struct Btf {
    /// Index = type id (0 is void).
    types: Vec<Type>,
    strings: Vec<u8>,
    /// Struct name -> type id of the first complete struct with that name.
    structs: HashMap<String, u32>,
    /// Tracepoint name -> type id of its prototype (from the `btf_trace_<name>` typedefs the
    /// kernel emits for every tracepoint; equal ids mean identical prototypes).
    tracepoints: HashMap<String, u32>,
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

impl Btf {
    /// The running kernel's BTF ([`kernel_btf_file`]).
    pub fn from_kernel() -> Result<Self, BtfError> {
        Self::from_file(kernel_btf_file())
    }

    pub(crate) fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&data).map_err(|e| match e {
            BtfError::Malformed(problem) => BtfError::NotBtf {
                path: path.display().to_string(),
                problem,
            },
            e => e,
        })
    }

    /// Parses raw BTF (little-endian, as on the machines sysscope runs on).
    pub(crate) fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let bad = |what: &str| BtfError::Malformed(what.to_string());
        if u16_at(data, 0) != Some(MAGIC) {
            return Err(bad("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(data, 4).ok_or_else(|| bad("short header"))? as usize;
        let type_off = u32_at(data, 8).ok_or_else(|| bad("short header"))? as usize;
        let type_len = u32_at(data, 12).ok_or_else(|| bad("short header"))? as usize;
        let str_off = u32_at(data, 16).ok_or_else(|| bad("short header"))? as usize;
        let str_len = u32_at(data, 20).ok_or_else(|| bad("short header"))? as usize;
        let types_start = hdr_len + type_off;
        let type_bytes = data
            .get(types_start..types_start + type_len)
            .ok_or_else(|| bad("type section out of bounds"))?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or_else(|| bad("string section out of bounds"))?
            .to_vec();

        let mut types = vec![Type::Other];
        let mut pos = 0usize;
        let word = |p: usize| u32_at(type_bytes, p).ok_or_else(|| bad("truncated type"));
        while pos < type_bytes.len() {
            let name = word(pos)?;
            let info = word(pos + 4)?;
            let size_or_type = word(pos + 8)?;
            pos += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let ty = match kind {
                KIND_INT => {
                    pos += 4;
                    Type::Int { size: size_or_type }
                }
                KIND_PTR => Type::Ptr,
                KIND_ARRAY => {
                    pos += 12;
                    Type::Array
                }
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let m_name = word(pos)?;
                        let m_ty = word(pos + 4)?;
                        let m_off = word(pos + 8)?;
                        pos += 12;
                        let (bit_offset, bitfield_size) = if kind_flag {
                            (m_off & 0xff_ffff, m_off >> 24)
                        } else {
                            (m_off, 0)
                        };
                        members.push(Member {
                            name: m_name,
                            ty: m_ty,
                            bit_offset,
                            bitfield_size,
                        });
                    }
                    Type::Composite {
                        name,
                        size: size_or_type,
                        members,
                    }
                }
                KIND_ENUM => {
                    let mut values = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let v_name = word(pos)?;
                        let raw = word(pos + 4)?;
                        pos += 8;
                        let v = if kind_flag {
                            raw as i32 as i64
                        } else {
                            raw as i64
                        };
                        values.push((v_name, v));
                    }
                    Type::Enum {
                        name,
                        size: size_or_type,
                        values,
                    }
                }
                KIND_ENUM64 => {
                    let mut values = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let v_name = word(pos)?;
                        let lo = word(pos + 4)? as u64;
                        let hi = word(pos + 8)? as u64;
                        pos += 12;
                        values.push((v_name, ((hi << 32) | lo) as i64));
                    }
                    Type::Enum {
                        name,
                        size: size_or_type,
                        values,
                    }
                }
                KIND_FWD | KIND_FUNC | KIND_FLOAT => Type::Other,
                KIND_TYPEDEF => Type::Alias {
                    name,
                    ty: size_or_type,
                },
                KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => Type::Alias {
                    name: 0,
                    ty: size_or_type,
                },
                KIND_FUNC_PROTO => {
                    pos += 8 * vlen;
                    Type::Other
                }
                KIND_VAR | KIND_DECL_TAG => {
                    pos += 4;
                    Type::Other
                }
                KIND_DATASEC => {
                    pos += 12 * vlen;
                    Type::Other
                }
                other => return Err(BtfError::Malformed(format!("unknown type kind {other}"))),
            };
            types.push(ty);
        }

        let mut btf = Self {
            types,
            strings,
            structs: HashMap::new(),
            tracepoints: HashMap::new(),
        };
        let mut structs = HashMap::new();
        let mut tracepoints = HashMap::new();
        for (id, ty) in btf.types.iter().enumerate() {
            match ty {
                Type::Composite { name, .. } if *name != 0 => {
                    if let Some(n) = btf.str_at(*name) {
                        structs.entry(n.to_string()).or_insert(id as u32);
                    }
                }
                Type::Alias { name, ty } if *name != 0 => {
                    if let Some(tp) = btf.str_at(*name).and_then(|n| n.strip_prefix("btf_trace_")) {
                        tracepoints.insert(tp.to_string(), btf.resolve(*ty));
                    }
                }
                _ => {}
            }
        }
        btf.structs = structs;
        btf.tracepoints = tracepoints;
        Ok(btf)
    }

    fn str_at(&self, off: u32) -> Option<&str> {
        let rest = self.strings.get(off as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// Follows typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(Type::Alias { ty, .. }) => id = *ty,
                _ => break,
            }
        }
        id
    }

    fn kind_of(&self, id: u32) -> MemberKind {
        match self.types.get(self.resolve(id) as usize) {
            Some(Type::Int { size }) => MemberKind::Int(*size),
            Some(Type::Enum { size, .. }) => MemberKind::Int(*size),
            Some(Type::Ptr) => MemberKind::Pointer,
            Some(Type::Composite { size, .. }) => MemberKind::Composite(*size),
            Some(Type::Array) => MemberKind::Array,
            _ => MemberKind::Other,
        }
    }

    /// The prototype (type id) of tracepoint `name`, if the kernel has it. Two tracepoints
    /// with the same id take the same arguments.
    pub(crate) fn tracepoint_proto(&self, name: &str) -> Option<u32> {
        self.tracepoints.get(name).copied()
    }

    /// Whether the kernel has a struct named `name`.
    #[cfg(test)]
    pub(crate) fn has_struct(&self, name: &str) -> bool {
        self.structs.contains_key(name)
    }

    /// Offset and kind of `strukt.member`, looking through anonymous structs and unions.
    pub(crate) fn field(&self, strukt: &str, member: &str) -> Result<Field, BtfError> {
        let id = *self
            .structs
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        self.find_member(id, member, 0, 0)
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.to_string(),
                member: member.to_string(),
            })
    }

    /// Like [`Btf::field`], and checks the member's kind.
    pub(crate) fn field_of_kind(
        &self,
        strukt: &str,
        member: &str,
        expected: MemberKind,
    ) -> Result<u32, BtfError> {
        let f = self.field(strukt, member)?;
        if f.kind != expected {
            return Err(BtfError::UnexpectedType {
                strukt: strukt.to_string(),
                member: member.to_string(),
                found: f.kind.to_string(),
                expected: expected.to_string(),
            });
        }
        Ok(f.offset)
    }

    /// The offset of `strukt.member`, a struct or union (`file.f_path`, `dentry.d_name`).
    pub(crate) fn struct_field(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let f = self.field(strukt, member)?;
        match f.kind {
            MemberKind::Composite(_) => Ok(f.offset),
            found => Err(BtfError::UnexpectedType {
                strukt: strukt.to_string(),
                member: member.to_string(),
                found: found.to_string(),
                expected: "a struct or union".to_string(),
            }),
        }
    }

    fn find_member(&self, id: u32, member: &str, base_bits: u32, depth: u32) -> Option<Field> {
        if depth > 8 {
            return None;
        }
        let Some(Type::Composite { members, .. }) = self.types.get(id as usize) else {
            return None;
        };
        for m in members {
            if m.bitfield_size != 0 {
                continue;
            }
            let bits = base_bits + m.bit_offset;
            if m.name == 0 {
                // Anonymous struct or union: its members belong to the outer struct.
                let inner = self.resolve(m.ty);
                if let Some(f) = self.find_member(inner, member, bits, depth + 1) {
                    return Some(f);
                }
            } else if self.str_at(m.name) == Some(member) {
                if !bits.is_multiple_of(8) {
                    return None;
                }
                return Some(Field {
                    offset: bits / 8,
                    kind: self.kind_of(m.ty),
                });
            }
        }
        None
    }

    /// The value of enumerator `value` of the enum named `enum_name`, if both exist.
    pub(crate) fn enum_value(&self, enum_name: &str, value: &str) -> Option<i64> {
        self.types.iter().find_map(|t| match t {
            Type::Enum { name, values, .. } if self.str_at(*name) == Some(enum_name) => values
                .iter()
                .find(|(n, _)| self.str_at(*n) == Some(value))
                .map(|(_, v)| *v),
            _ => None,
        })
    }

    /// Number of types (for diagnostics and tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.types.len() - 1
    }
}

/// The running kernel's BTF for `test`, which needs it: `None` (after
/// [`crate::util::test_support::require`] said so) where a sandbox hides it.
#[cfg(test)]
pub(crate) fn for_test(test: &str) -> Option<Btf> {
    let btf = Btf::from_kernel();
    let found = btf.is_ok();
    crate::util::test_support::require(test, "the kernel's BTF", found)
        .then(|| btf.expect("checked"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a small BTF blob by hand, the way the kernel lays it out.
    struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
    }

    impl Builder {
        fn new() -> Self {
            Self {
                types: Vec::new(),
                strings: vec![0],
            }
        }
        fn s(&mut self, name: &str) -> u32 {
            if name.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(name.as_bytes());
            self.strings.push(0);
            off
        }
        fn head(&mut self, name: &str, kind: u32, vlen: u32, kflag: bool, size_or_type: u32) {
            let n = self.s(name);
            let info = (kind << 24) | vlen | ((kflag as u32) << 31);
            for w in [n, info, size_or_type] {
                self.types.extend_from_slice(&w.to_le_bytes());
            }
        }
        fn int(&mut self, name: &str, size: u32) {
            self.head(name, KIND_INT, 0, false, size);
            self.types.extend_from_slice(&(size * 8).to_le_bytes());
        }
        fn composite(&mut self, kind: u32, name: &str, size: u32, members: &[(&str, u32, u32)]) {
            self.head(name, kind, members.len() as u32, false, size);
            for (m, ty, bits) in members {
                let n = self.s(m);
                for w in [n, *ty, *bits] {
                    self.types.extend_from_slice(&w.to_le_bytes());
                }
            }
        }
        fn finish(self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.push(1);
            out.push(0);
            out.extend_from_slice(&24u32.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
            out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
            out.extend_from_slice(&(self.strings.len() as u32).to_le_bytes());
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    #[test]
    fn offsets_through_typedefs_and_anonymous_unions() {
        let mut b = Builder::new();
        b.int("unsigned int", 4); // 1
        b.head("blk_opf_t", KIND_TYPEDEF, 0, false, 1); // 2
        b.head("", KIND_PTR, 0, false, 5); // 3 -> struct request
        b.composite(KIND_UNION, "", 8, &[("a", 1, 0), ("b", 3, 0)]); // 4
        b.composite(
            KIND_STRUCT,
            "request",
            32,
            &[("q", 3, 0), ("cmd_flags", 2, 64), ("", 4, 128)],
        ); // 5
        b.head("req_op", KIND_ENUM, 2, false, 4); // 6
        let (r, w) = (b.s("REQ_OP_READ"), b.s("REQ_OP_WRITE"));
        for v in [r, 0, w, 1] {
            b.types.extend_from_slice(&v.to_le_bytes());
        }
        b.head("", KIND_FUNC_PROTO, 1, false, 0); // 7: void (struct request *)
        b.types.extend_from_slice(&0u32.to_le_bytes());
        b.types.extend_from_slice(&3u32.to_le_bytes());
        b.head("", KIND_PTR, 0, false, 7); // 8
        b.head("btf_trace_block_rq_issue", KIND_TYPEDEF, 0, false, 8); // 9
        b.head("btf_trace_block_io_start", KIND_TYPEDEF, 0, false, 8); // 10
        let btf = Btf::parse(&b.finish()).unwrap();
        assert_eq!(btf.len(), 10);
        assert_eq!(btf.tracepoint_proto("block_rq_issue"), Some(8));
        assert_eq!(
            btf.tracepoint_proto("block_io_start"),
            btf.tracepoint_proto("block_rq_issue")
        );
        assert_eq!(btf.tracepoint_proto("block_rq_complete"), None);
        assert_eq!(
            btf.field("request", "q").unwrap(),
            Field {
                offset: 0,
                kind: MemberKind::Pointer
            }
        );
        assert_eq!(
            btf.field_of_kind("request", "cmd_flags", MemberKind::Int(4))
                .unwrap(),
            8
        );
        assert_eq!(
            btf.field_of_kind("request", "b", MemberKind::Pointer)
                .unwrap(),
            16
        );
        assert!(matches!(
            btf.field("request", "nope"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(
            btf.field("bio", "bi_blkg"),
            Err(BtfError::NoStruct(_))
        ));
        let e = btf
            .field_of_kind("request", "q", MemberKind::Int(8))
            .unwrap_err()
            .to_string();
        assert!(e.contains("request.q") && e.contains("pointer"), "{e}");
        assert_eq!(btf.enum_value("req_op", "REQ_OP_WRITE"), Some(1));
        assert_eq!(btf.enum_value("req_op", "REQ_OP_FLUSH"), None);
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(
            Btf::parse(b"not btf at all, really"),
            Err(BtfError::Malformed(_))
        ));
        assert!(matches!(Btf::parse(&[]), Err(BtfError::Malformed(_))));
    }

    #[test]
    fn reads_the_running_kernel() {
        // Every machine sysscope supports has kernel BTF; a sandbox may hide it.
        let Some(btf) = for_test("reads_the_running_kernel") else {
            return;
        };
        assert!(btf.len() > 1000);
        assert!(btf.has_struct("task_struct"));
        let f = btf.field("task_struct", "pid").unwrap();
        assert_eq!(f.kind, MemberKind::Int(4));
        assert!(btf.tracepoint_proto("sys_enter").is_some());
    }
}
