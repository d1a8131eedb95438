//! BPF support shared by the guest agent (`cosched-agent`) and the host's BPF (`cosched-hostbpf`):
//! plain data read from the bytes the kernel wrote (a map value, a ring-buffer record) and
//! written into a map, and the heap storage a libbpf-rs skeleton borrows for its whole life.
//!
//! `include/vmlinux.h` is the kernel's types for both sides' BPF programs (the test guest's
//! Debian 6.1 kernel, from `guest/gen-vmlinux-h.sh`; CO-RE relocates them on other kernels):
//! their build scripts put `include/` on clang's include path (by its relative path: a build
//! dependency on this crate would build libbpf a second time, for the build host).

use std::mem::{size_of, MaybeUninit};
use std::ptr::NonNull;

use libbpf_rs::OpenObject;

/// A type whose every bit pattern is a valid value, so that it can be read from bytes the kernel
/// wrote (a map value, a ring-buffer record), and written as bytes into a map.
///
/// # Safety
///
/// Implement only for `#[repr(C)]` types made of integers, arrays of integers, and other `Plain`
/// types, with no padding: no `bool`, no Rust `enum`, no pointer or reference.
pub unsafe trait Plain: Copy {}

/// Reads a `T` from exactly `size_of::<T>()` bytes; `None` if the length differs (a layout that
/// does not match the generated type).
pub fn read_plain<T: Plain>(bytes: &[u8]) -> Option<T> {
    if bytes.len() != size_of::<T>() {
        return None;
    }
    // SAFETY: `bytes` holds exactly `size_of::<T>()` initialised bytes; `read_unaligned` copies
    // them without any alignment requirement; `T: Plain` makes any bit pattern a valid `T`.
    Some(unsafe { bytes.as_ptr().cast::<T>().read_unaligned() })
}

/// Reads a `T` from the start of `bytes` (any alignment); `None` if `bytes` is too short.
pub fn read_prefix<T: Plain>(bytes: &[u8]) -> Option<T> {
    bytes.get(..size_of::<T>()).and_then(read_plain)
}

/// The bytes of a plain value, to write into a map.
pub fn bytes_of<T: Plain>(v: &T) -> &[u8] {
    // SAFETY: `T: Plain` has no padding and no pointers; the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// The heap storage a BPF skeleton borrows for its whole life (`libbpf_rs::OpenObject`, then the
/// loaded `Object` in its place), owned here (freed on drop) and lent to one skeleton. Held as a
/// raw pointer, not a `Box`, so that moving its owner does not assert unique access while the
/// skeleton holds a reference into it.
pub struct ObjectStorage(NonNull<MaybeUninit<OpenObject>>);

impl ObjectStorage {
    pub fn new() -> ObjectStorage {
        ObjectStorage(NonNull::from(Box::leak(Box::new(MaybeUninit::uninit()))))
    }

    /// The storage, for a skeleton builder's `open`.
    ///
    /// # Safety
    ///
    /// At most one skeleton may hold it at a time (a failed load's skeleton is dropped before
    /// the next one is opened in the same storage), and the skeleton made from it (and anything
    /// made from that) must be dropped before the storage: the `'static` must never be observed
    /// past the storage's end.
    pub unsafe fn lend(&self) -> &'static mut MaybeUninit<OpenObject> {
        // SAFETY: the pointer is valid for reads and writes until `drop`; the caller promises
        // that one skeleton at a time holds the reference and that it does not outlive the
        // storage.
        unsafe { &mut *self.0.as_ptr() }
    }
}

impl Default for ObjectStorage {
    fn default() -> Self {
        ObjectStorage::new()
    }
}

impl Drop for ObjectStorage {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `new` and is freed only here, once. The
        // skeleton that used it was dropped before (its owner declares the storage after the
        // skeleton; `lend`'s callers drop their skeleton before this storage) and dropped the
        // object it held; a `MaybeUninit` has nothing left to drop.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

// SAFETY: the storage is plain memory owned by this value; libbpf-rs declares OpenObject Send.
unsafe impl Send for ObjectStorage {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(C)]
    struct Pair {
        a: u64,
        b: u32,
        c: u32,
    }
    // SAFETY: repr(C), integers only, no padding.
    unsafe impl Plain for Pair {}

    #[test]
    fn reads_plain_data_of_the_exact_size_only() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&7u64.to_ne_bytes());
        bytes.extend_from_slice(&8u32.to_ne_bytes());
        bytes.extend_from_slice(&9u32.to_ne_bytes());
        assert_eq!(read_plain::<Pair>(&bytes), Some(Pair { a: 7, b: 8, c: 9 }));
        // Unaligned source.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        assert_eq!(read_plain::<Pair>(&shifted[1..]), Some(Pair { a: 7, b: 8, c: 9 }));
        assert_eq!(read_plain::<Pair>(&bytes[..15]), None);
        assert_eq!(read_plain::<Pair>(&shifted), None);
    }

    #[test]
    fn reads_a_prefix_and_writes_the_same_bytes() {
        let p = Pair { a: 1, b: 2, c: 3 };
        let mut bytes = bytes_of(&p).to_vec();
        assert_eq!(bytes.len(), 16);
        bytes.push(0xff);
        assert_eq!(read_prefix::<Pair>(&bytes), Some(p));
        assert_eq!(read_prefix::<Pair>(&bytes[..15]), None);
    }
}
