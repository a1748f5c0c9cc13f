//! The GGUF v3 container (what llama.cpp's `gguf.c` and gguf-py read): a header, typed
//! metadata key-values, tensor infos, then each tensor's bytes at an aligned offset.
//!
//! A tensor is (name, dims, ggml type, bytes): the writer never looks inside the bytes, so any
//! type whose block layout is known here (`GgmlType::block`) can be written once something
//! produces its bytes. All integers are little-endian; strings are a u64 length and UTF-8.

use crate::error::{Error, Result};
use std::path::Path;

/// A reading step's result: the message says what is wrong, `Gguf::read` adds the file.
type Parse<T> = std::result::Result<T, String>;

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const VERSION: u32 = 3;
/// The alignment of the data section and of every tensor in it, unless `general.alignment`
/// says otherwise.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// The ggml tensor types difftx writes or reads (ids from ggml.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    /// 32 weights: one f16 scale, then 16 bytes of 4-bit values (two per byte)
    Q4_0,
    /// 32 weights: one f16 scale, then 32 int8 values
    Q8_0,
    Bf16,
}

impl GgmlType {
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q8_0 => 8,
            GgmlType::Bf16 => 30,
        }
    }

    pub fn from_id(id: u32) -> Option<Self> {
        [Self::F32, Self::F16, Self::Q4_0, Self::Q8_0, Self::Bf16]
            .into_iter()
            .find(|t| t.id() == id)
    }

    /// (values per block, bytes per block)
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q8_0 => (32, 34),
        }
    }

    /// Bytes of a tensor of `dims` (ggml order: dims[0] is the row length, which must be a
    /// whole number of blocks); `None` if it is not.
    pub fn size_of(self, dims: &[u64]) -> Option<u64> {
        let (per, bytes) = self.block();
        let row = *dims.first()?;
        if row % per as u64 != 0 {
            return None;
        }
        dims[1..]
            .iter()
            .try_fold(row / per as u64 * bytes as u64, |acc, &d| {
                acc.checked_mul(d)
            })
    }
}

/// A metadata value. Arrays carry their element type so that an empty one can be written.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// GGUF metadata value type ids (gguf.h `gguf_type`), in id order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    Str,
    Array,
    U64,
    I64,
    F64,
}

const VALUE_TYPES: [ValueType; 13] = [
    ValueType::U8,
    ValueType::I8,
    ValueType::U16,
    ValueType::I16,
    ValueType::U32,
    ValueType::I32,
    ValueType::F32,
    ValueType::Bool,
    ValueType::Str,
    ValueType::Array,
    ValueType::U64,
    ValueType::I64,
    ValueType::F64,
];

impl ValueType {
    fn id(self) -> u32 {
        VALUE_TYPES.iter().position(|&t| t == self).expect("listed") as u32
    }
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::Str,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    pub fn strings(items: impl IntoIterator<Item = String>) -> Self {
        Value::Array(ValueType::Str, items.into_iter().map(Value::Str).collect())
    }

    pub fn i32s(items: impl IntoIterator<Item = i32>) -> Self {
        Value::Array(ValueType::I32, items.into_iter().map(Value::I32).collect())
    }

    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(x) => Some(x.into()),
            Value::U16(x) => Some(x.into()),
            Value::U32(x) => Some(x.into()),
            Value::U64(x) => Some(x),
            Value::I8(x) => u64::try_from(x).ok(),
            Value::I16(x) => u64::try_from(x).ok(),
            Value::I32(x) => u64::try_from(x).ok(),
            Value::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor: `dims` in ggml order (`dims[0]` is the contiguous row length, so a torch
/// `[out, in]` matrix is `[in, out]`), and its bytes in `ty`'s layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Vec<u8>,
}

/// A whole GGUF file in memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gguf {
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<Tensor>,
}

impl Gguf {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn alignment(&self) -> usize {
        self.get("general.alignment")
            .and_then(Value::as_u64)
            .map_or(DEFAULT_ALIGNMENT, |a| a as usize)
    }

    /// The file's bytes. Fails if a tensor's byte count does not match its dims and type.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        // 1. Header and metadata.
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, VERSION);
        put_u64(&mut out, self.tensors.len() as u64);
        put_u64(&mut out, self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            put_u32(&mut out, value.value_type().id());
            put_value(&mut out, value);
        }
        // 2. Tensor infos, with offsets into the data section, each aligned.
        let mut offset = 0u64;
        for t in &self.tensors {
            if t.ty.size_of(&t.dims) != Some(t.data.len() as u64) {
                return Err(Error::Invalid(format!(
                    "GGUF tensor {}: {} bytes do not fit dims {:?} of type {:?}",
                    t.name,
                    t.data.len(),
                    t.dims,
                    t.ty
                )));
            }
            put_str(&mut out, &t.name);
            put_u32(&mut out, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut out, d);
            }
            put_u32(&mut out, t.ty.id());
            put_u64(&mut out, offset);
            offset = (offset + t.data.len() as u64).next_multiple_of(align as u64);
        }
        // 3. The data section: padding to the alignment, then each tensor, padded.
        for t in &self.tensors {
            out.resize(out.len().next_multiple_of(align), 0);
            out.extend_from_slice(&t.data);
        }
        out.resize(out.len().next_multiple_of(align), 0);
        Ok(out)
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        crate::util::write_atomic(path, &self.to_bytes()?)
    }

    /// Reads a GGUF (version 2 or 3) file, checking every length, type and offset against
    /// the file's size; a damaged file is an error naming it.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes).map_err(|msg| Error::Checkpoint {
            path: path.to_path_buf(),
            msg: format!("not a readable GGUF file ({msg})"),
        })
    }

    pub fn from_bytes(bytes: &[u8]) -> Parse<Self> {
        // 1. Header and metadata.
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC {
            return Err("bad magic, expected GGUF".into());
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format!("version {version}, expected 2 or 3"));
        }
        let (n_tensors, n_kv) = (r.u64()?, r.u64()?);
        let mut g = Gguf::default();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.value_type()?;
            let value = r.value(ty)?;
            g.metadata.push((key, value));
        }
        // 2. Tensor infos.
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims > 4 {
                return Err(format!("tensor {name}: {n_dims} dims (at most 4)"));
            }
            let dims = (0..n_dims).map(|_| r.u64()).collect::<Parse<Vec<_>>>()?;
            let id = r.u32()?;
            let ty = GgmlType::from_id(id)
                .ok_or_else(|| format!("tensor {name}: ggml type {id} is not supported"))?;
            let offset = r.u64()?;
            infos.push((name, dims, ty, offset));
        }
        // 3. Data: each tensor at its aligned offset, inside the file.
        let align = g.alignment();
        if align == 0 || !align.is_power_of_two() {
            return Err(format!("general.alignment {align} is not a power of two"));
        }
        let start = r.at.next_multiple_of(align);
        for (name, dims, ty, offset) in infos {
            let size = ty
                .size_of(&dims)
                .ok_or_else(|| format!("tensor {name}: dims {dims:?} do not fit type {ty:?}"))?;
            if offset % align as u64 != 0 {
                return Err(format!("tensor {name}: offset {offset} is not aligned"));
            }
            let from = (start as u64).checked_add(offset);
            let to = from.and_then(|f| f.checked_add(size));
            let data = match (from, to) {
                (Some(f), Some(t)) if t <= bytes.len() as u64 => {
                    bytes[f as usize..t as usize].to_vec()
                }
                _ => return Err(format!("tensor {name}: data runs past the end of the file")),
            };
            g.tensors.push(Tensor {
                name,
                dims,
                ty,
                data,
            });
        }
        Ok(g)
    }
}

fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, x: u64) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => put_u32(out, *x),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::Str(s) => put_str(out, s),
        Value::Array(ty, items) => {
            put_u32(out, ty.id());
            put_u64(out, items.len() as u64);
            for item in items {
                debug_assert_eq!(item.value_type(), *ty, "GGUF arrays hold one type");
                put_value(out, item);
            }
        }
        Value::U64(x) => put_u64(out, *x),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// A cursor over the file's bytes whose every read is checked against the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64) -> Parse<&'a [u8]> {
        let end = (self.at as u64)
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len() as u64)
            .ok_or_else(|| format!("truncated at byte {}", self.at))?;
        let s = &self.bytes[self.at..end as usize];
        self.at = end as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Parse<[u8; N]> {
        Ok(self.take(N as u64)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Parse<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Parse<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Parse<String> {
        let n = self.u64()?;
        let at = self.at;
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| format!("string at byte {at} is not UTF-8"))
    }

    fn value_type(&mut self) -> Parse<ValueType> {
        let id = self.u32()?;
        VALUE_TYPES
            .get(id as usize)
            .copied()
            .ok_or_else(|| format!("unknown metadata value type {id}"))
    }

    fn value(&mut self, ty: ValueType) -> Parse<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>()?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array()?)),
            ValueType::Bool => Value::Bool(self.array::<1>()?[0] != 0),
            ValueType::Str => Value::Str(self.string()?),
            ValueType::Array => {
                let elem = self.value_type()?;
                if elem == ValueType::Array {
                    return Err("nested metadata arrays are not supported".into());
                }
                let n = self.u64()?;
                // every element takes at least one byte: a count past the end is damage
                if n > (self.bytes.len() - self.at) as u64 {
                    return Err(format!("array of {n} elements runs past the end"));
                }
                let items = (0..n)
                    .map(|_| self.value(elem))
                    .collect::<Parse<Vec<_>>>()?;
                Value::Array(elem, items)
            }
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array()?)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Gguf {
        Gguf {
            metadata: vec![
                ("general.architecture".into(), Value::Str("llama".into())),
                ("n".into(), Value::U32(7)),
                ("eps".into(), Value::F32(1e-5)),
                ("flag".into(), Value::Bool(true)),
                ("names".into(), Value::strings(["a".into(), "bc".into()])),
                ("empty".into(), Value::Array(ValueType::Str, vec![])),
                ("types".into(), Value::i32s([1, 6])),
            ],
            tensors: vec![
                Tensor {
                    name: "w".into(),
                    dims: vec![3, 2],
                    ty: GgmlType::F32,
                    data: (0..24).collect(),
                },
                Tensor {
                    name: "b".into(),
                    dims: vec![5],
                    ty: GgmlType::Bf16,
                    data: vec![9; 10],
                },
            ],
        }
    }

    #[test]
    fn a_written_file_reads_back_with_aligned_tensors() {
        let g = sample();
        let bytes = g.to_bytes().unwrap();
        assert_eq!(&bytes[..4], b"GGUF");
        assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 3);
        assert_eq!(bytes.len() % DEFAULT_ALIGNMENT, 0);
        assert_eq!(Gguf::from_bytes(&bytes).unwrap(), g);
        // the second tensor starts at the next multiple of 32 after the first's 24 bytes
        let b_at = bytes.len() - DEFAULT_ALIGNMENT;
        assert_eq!(&bytes[b_at..b_at + 10], &[9; 10]);
        assert_eq!(
            &bytes[b_at - DEFAULT_ALIGNMENT..b_at - 8],
            &(0..24).collect::<Vec<u8>>()
        );
    }

    #[test]
    fn damaged_files_and_wrong_sizes_are_errors() {
        let bytes = sample().to_bytes().unwrap();
        for cut in [3, 20, 60, bytes.len() - 40] {
            assert!(Gguf::from_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(Gguf::from_bytes(&bad).unwrap_err().contains("magic"));
        let mut g = sample();
        g.tensors[0].data.pop();
        assert!(g.to_bytes().is_err());
    }

    #[test]
    fn block_types_size_whole_blocks_only() {
        assert_eq!(GgmlType::Q8_0.size_of(&[64, 3]), Some(2 * 34 * 3));
        assert_eq!(GgmlType::Q4_0.size_of(&[32, 2]), Some(2 * 18));
        assert_eq!(GgmlType::Q4_0.size_of(&[48, 2]), None);
        assert_eq!(GgmlType::from_id(30), Some(GgmlType::Bf16));
        assert_eq!(GgmlType::from_id(3), None);
    }
}
