//! Ways a kernel writes its outputs: an input gradient set or added to (`Grad`), and disjoint
//! parts of one buffer written from many rayon tasks (`SharedMut`).

/// How a backward writes an input gradient: `Set` overwrites the buffer (its first
/// contribution, which spares zero-filling it first), `Add` adds to what is there.
pub enum Grad<'a> {
    Set(&'a mut [f32]),
    Add(&'a mut [f32]),
}

impl<'a> Grad<'a> {
    /// The buffer, and whether to add to it.
    pub fn parts(self) -> (&'a mut [f32], bool) {
        match self {
            Grad::Set(d) => (d, false),
            Grad::Add(d) => (d, true),
        }
    }
}

/// A raw pointer that rayon tasks share to write disjoint parts of one buffer (heads of an
/// interleaved (B, T, NH, d) tensor). Every use states why the parts are disjoint.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut {
    ptr: *mut f32,
    len: usize,
}
// SAFETY: a SharedMut is a pointer into an f32 buffer; every write through it goes to a part
// that its user keeps disjoint from other threads' (`slice`'s contract), and f32 is Send.
unsafe impl Send for SharedMut {}
// SAFETY: as for Send: shared references only hand out disjoint parts.
unsafe impl Sync for SharedMut {}

impl SharedMut {
    pub fn new(s: &mut [f32]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }
    /// The `len` elements at `ptr`.
    ///
    /// # Safety
    /// They must stay valid while this is used, and no one else may touch the parts written
    /// through it.
    pub unsafe fn from_raw(ptr: *mut f32, len: usize) -> Self {
        SharedMut { ptr, len }
    }
    /// A raw pointer to element `off`, checked to have `len` elements behind it.
    ///
    /// # Safety
    /// As for `slice`, for whatever the caller then writes through it.
    pub unsafe fn ptr(&self, off: usize, len: usize) -> *mut f32 {
        assert!(
            off + len <= self.len,
            "SharedMut: {off}+{len} > {}",
            self.len
        );
        // SAFETY: off + len ≤ self.len (asserted above), so the offset stays inside the
        // buffer this was made from.
        unsafe { self.ptr.add(off) }
    }
    /// Elements off..off + len, checked to lie inside the buffer.
    ///
    /// # Safety
    /// No two live slices obtained from this pointer may overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, off: usize, len: usize) -> &mut [f32] {
        assert!(
            off + len <= self.len,
            "SharedMut: {off}+{len} > {}",
            self.len
        );
        // SAFETY: off..off + len lies inside the buffer (asserted above), which outlives this
        // (`from_raw`/`new`); that no two live slices overlap is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}
