//! How a family declares what the object file holds for it: the [`maps!`], [`programs!`] and
//! [`globals!`] macros each take one declaration per item and emit both its name constant
//! (what the probes' `#[map(name = ...)]` and the loader agree on) and, with the `user`
//! feature, a spec table (the map's kind with its key and value types, a global's type) that
//! the exporter's object-contract test checks against the embedded object as data.

/// The kind of a map, named after the `aya-ebpf` type the probes declare it with.
#[cfg(feature = "user")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Array,
    PerCpuArray,
    HashMap,
    LruHashMap,
    Stack,
    RingBuf,
    TaskStorage,
    CgroupArray,
}

/// One map as user space reads it.
#[cfg(feature = "user")]
#[derive(Clone, Copy, Debug)]
pub struct MapSpec {
    pub name: &'static str,
    pub kind: MapKind,
    /// Size of the key (0: a map without keys, such as a stack or a ring buffer).
    pub key_size: usize,
    /// Size of the value; for a ring buffer, of one record (the kernel frames the records, so
    /// the map itself declares none).
    pub value_size: usize,
}

/// One global the loader writes before the programs load.
#[cfg(feature = "user")]
#[derive(Clone, Copy, Debug)]
pub struct GlobalSpec {
    pub name: &'static str,
    /// Size of the value the loader writes.
    pub size: usize,
}

/// What one probe family (a file of `ebpf/probes/src`) puts in the object.
#[cfg(feature = "user")]
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub name: &'static str,
    pub maps: &'static [MapSpec],
    pub programs: &'static [&'static str],
    pub globals: &'static [GlobalSpec],
}

/// Declares a family's maps: `NAME: Kind(Key => Value),` each (`()` for no key; a ring
/// buffer's value is its record). Emits `pub mod maps` with a `&str` constant per map, and
/// with the `user` feature `MAPS: &[MapSpec]`.
macro_rules! maps {
    ($($(#[$doc:meta])* $name:ident: $kind:ident($key:ty => $value:ty),)*) => {
        /// Names of the family's maps, as user space looks them up in the loaded object.
        pub mod maps {
            $($(#[$doc])* pub const $name: &str = stringify!($name);)*
        }

        /// The family's maps, with the types user space reads them as.
        #[cfg(feature = "user")]
        pub const MAPS: &[$crate::MapSpec] = &[$($crate::MapSpec {
            name: maps::$name,
            kind: $crate::MapKind::$kind,
            key_size: core::mem::size_of::<$key>(),
            value_size: core::mem::size_of::<$value>(),
        },)*];
    };
}

/// Declares a family's programs: `CONST = "program_name",` each. Emits `pub mod programs`
/// with the constants, and with the `user` feature `PROGRAMS: &[&str]`.
macro_rules! programs {
    ($($(#[$doc:meta])* $name:ident = $program:literal,)*) => {
        /// Names of the family's programs in the object file.
        pub mod programs {
            $($(#[$doc])* pub const $name: &str = $program;)*
        }

        /// The family's programs.
        #[cfg(feature = "user")]
        pub const PROGRAMS: &[&str] = &[$(programs::$name,)*];
    };
}

/// Declares a family's globals: `NAME: Type,` each. Emits `pub mod globals` with a `&str`
/// constant per global, and with the `user` feature `GLOBALS: &[GlobalSpec]`.
macro_rules! globals {
    ($($(#[$doc:meta])* $name:ident: $type:ty,)*) => {
        /// Names of the family's global variables, which the loader sets before the programs
        /// load.
        pub mod globals {
            $($(#[$doc])* pub const $name: &str = stringify!($name);)*
        }

        /// The family's globals, with the types the loader writes.
        #[cfg(feature = "user")]
        pub const GLOBALS: &[$crate::GlobalSpec] = &[$($crate::GlobalSpec {
            name: globals::$name,
            size: core::mem::size_of::<$type>(),
        },)*];
    };
}

/// `aya::Pod` for map keys and values, so user space can read them (with the `user` feature).
macro_rules! pod {
    ($($type:ty),* $(,)?) => {
        #[cfg(feature = "user")]
        #[allow(
            clippy::undocumented_unsafe_blocks,
            reason = "one SAFETY note, here, covers every impl: they share the same argument"
        )]
        const _: () = {
            // SAFETY: every type listed is #[repr(C)], made only of integers and integer
            // arrays, with explicit padding fields, so any bit pattern is a valid value.
            $(unsafe impl aya::Pod for $type {})*
        };
    };
}
