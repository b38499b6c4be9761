//! `.npy` files in and out, with errors that say which file and what is wrong with it.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use attn_dsl::Dtype;
use half::{bf16, f16};
use npyz::WriterBuilder;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NpyError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a .npy file: {reason}")]
    NotNpy { path: PathBuf, reason: String },
    #[error(
        "{path} has a malformed .npy header (its dictionary of descr, fortran_order and shape)"
    )]
    Header {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: dtype {found}, expected {expected}")]
    DType {
        path: PathBuf,
        found: String,
        expected: &'static str,
    },
    #[error("{path}: shape {found:?}, expected {expected}")]
    Shape {
        path: PathBuf,
        found: Vec<u64>,
        expected: String,
    },
    #[error("{path}: shape {shape:?} {reason}; save the array again with np.save")]
    Size {
        path: PathBuf,
        shape: Vec<u64>,
        reason: String,
    },
    #[error("{path}: Fortran-ordered arrays are not supported; save with np.ascontiguousarray")]
    FortranOrder { path: PathBuf },
    #[error("{path}: value {value} at index {index} is not a valid row index")]
    Index {
        path: PathBuf,
        index: usize,
        value: i128,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NpyError + '_ {
    move |source| NpyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The preamble every .npy file starts with: the magic, the version and the header's
/// length, checked against the file, so that a file of another kind or a truncated one is
/// named as such rather than reported as a failed read. Returns where the header starts and
/// its length.
fn check_preamble(path: &Path, bytes: &[u8], len: u64) -> Result<(u64, u64), NpyError> {
    let not = |reason: String| NpyError::NotNpy {
        path: path.to_path_buf(),
        reason,
    };
    if len < 10 {
        return Err(not(format!(
            "it is {len} bytes, shorter than a .npy preamble (10)"
        )));
    }
    if !bytes.starts_with(b"\x93NUMPY") {
        return Err(not(
            "it does not start with the .npy magic \\x93NUMPY".into()
        ));
    }
    let (major, header_len, preamble) = match bytes[6] {
        1 => (1, u64::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        v @ (2 | 3) if bytes.len() >= 12 => (
            v,
            u64::from(u32::from_le_bytes([
                bytes[8], bytes[9], bytes[10], bytes[11],
            ])),
            12,
        ),
        v => {
            return Err(not(format!(
                "format version {v}.{} is not 1, 2 or 3",
                bytes[7]
            )));
        }
    };
    if preamble + header_len > len {
        return Err(not(format!(
            "its version {major} header claims {header_len} bytes, but the file ends {} bytes \
             after the preamble (truncated?)",
            len - preamble
        )));
    }
    Ok((preamble, header_len))
}

/// Refuses a header whose shape counts more elements than a u64 holds, before npyz reads
/// it (npyz multiplies the dimensions unchecked). A shape it cannot find is left to npyz.
fn check_header_shape(path: &Path, header: &str) -> Result<(), NpyError> {
    let Some(dims) = header_dims(header) else {
        return Ok(());
    };
    let count = dims
        .iter()
        .try_fold(1u64, |n, d| u64::try_from(*d).ok()?.checked_mul(n));
    match count {
        Some(_) => Ok(()),
        None => Err(NpyError::Size {
            path: path.to_path_buf(),
            shape: dims
                .iter()
                .map(|d| u64::try_from(*d).unwrap_or(u64::MAX))
                .collect(),
            reason: "counts more elements than 2^64 (a corrupt header?)".into(),
        }),
    }
}

/// The dimensions of the `shape` tuple of a header's dictionary, where they are plain
/// integers.
fn header_dims(header: &str) -> Option<Vec<u128>> {
    let rest = &header[header.find("shape")?..];
    let open = rest.find('(')?;
    let close = open + rest[open..].find(')')?;
    rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.trim_end_matches('L').parse().ok())
        .collect()
}

/// Whether the file holds the bytes its header's shape claims, checked before anything is
/// allocated for them: a corrupt shape is refused by name, not read into memory.
fn check_size(path: &Path, npy: &Opened, element_bytes: u64) -> Result<(), NpyError> {
    let shape = npy.file.shape();
    let size = |reason: String| NpyError::Size {
        path: path.to_path_buf(),
        shape: shape.to_vec(),
        reason,
    };
    match shape
        .iter()
        .try_fold(element_bytes, |n, d| n.checked_mul(*d))
    {
        None => Err(size("counts more bytes than 2^64".into())),
        Some(bytes) if bytes > npy.data_bytes => Err(size(format!(
            "needs {bytes} bytes of data, but the file holds {} after its header (truncated, \
             or a wrong shape in the header)",
            npy.data_bytes
        ))),
        Some(_) => Ok(()),
    }
}

/// An opened .npy file and the bytes that follow its header.
struct Opened {
    file: npyz::NpyFile<BufReader<File>>,
    data_bytes: u64,
}

fn open(path: &Path) -> Result<Opened, NpyError> {
    use std::io::Read;
    use std::io::{Seek, SeekFrom};
    let mut file = File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len();
    let mut preamble = [0u8; 12];
    let got = file.read(&mut preamble).map_err(io(path))?;
    let (start, header_len) = check_preamble(path, &preamble[..got], len)?;
    let mut header = Vec::new();
    file.seek(SeekFrom::Start(start)).map_err(io(path))?;
    (&mut file)
        .take(header_len.min(1 << 20))
        .read_to_end(&mut header)
        .map_err(io(path))?;
    check_header_shape(path, &String::from_utf8_lossy(&header))?;
    file.seek(SeekFrom::Start(0)).map_err(io(path))?;
    let data_bytes = len - start - header_len;
    let npy = npyz::NpyFile::new(BufReader::new(file)).map_err(|source| NpyError::Header {
        path: path.to_path_buf(),
        source,
    })?;
    if npy.order() == npyz::Order::Fortran {
        return Err(NpyError::FortranOrder {
            path: path.to_path_buf(),
        });
    }
    Ok(Opened {
        file: npy,
        data_bytes,
    })
}

fn descr(npy: &Opened) -> String {
    match npy.file.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => format!("{other:?}"),
    }
}

/// A little-endian f32 array and its shape, which must have one of `ranks` dimensions.
pub fn read_f32(path: &Path, ranks: &[usize]) -> Result<(Vec<u64>, Vec<f32>), NpyError> {
    let npy = open(path)?;
    let found = descr(&npy);
    if found != "<f4" {
        return Err(NpyError::DType {
            path: path.to_path_buf(),
            found,
            expected: "float32 (<f4)",
        });
    }
    let shape = checked_shape(path, &npy, ranks)?;
    check_size(path, &npy, 4)?;
    let data = npy.file.into_vec::<f32>().map_err(io(path))?;
    Ok((shape, data))
}

/// A float array in f32, f16 (`<f2`) or bf16 (a `<u2` view of the bits, as
/// `x.view(np.uint16)` saves a bf16 tensor: NumPy has no bf16), widened to f32, with its
/// shape (one of `ranks` dimensions) and the element type it was stored in.
pub fn read_float(path: &Path, ranks: &[usize]) -> Result<(Vec<u64>, Vec<f32>, Dtype), NpyError> {
    let npy = open(path)?;
    let found = descr(&npy);
    let dtype = match found.as_str() {
        "<f4" => Dtype::F32,
        "<f2" => Dtype::F16,
        "<u2" => Dtype::Bf16,
        _ => {
            return Err(NpyError::DType {
                path: path.to_path_buf(),
                found,
                expected: "float32 (<f4), float16 (<f2) or bf16 bits as uint16 (<u2)",
            });
        }
    };
    let shape = checked_shape(path, &npy, ranks)?;
    check_size(path, &npy, u64::from(dtype.bytes()))?;
    let npy = npy.file;
    let data = match dtype {
        Dtype::F32 => npy.into_vec::<f32>().map_err(io(path))?,
        Dtype::F16 => widen(npy.into_vec::<f16>().map_err(io(path))?, f16::to_f32),
        Dtype::Bf16 => widen(npy.into_vec::<u16>().map_err(io(path))?, |b| {
            bf16::from_bits(b).to_f32()
        }),
    };
    Ok((shape, data, dtype))
}

fn widen<T>(data: Vec<T>, f: impl Fn(T) -> f32) -> Vec<f32> {
    data.into_iter().map(f).collect()
}

fn checked_shape(path: &Path, npy: &Opened, ranks: &[usize]) -> Result<Vec<u64>, NpyError> {
    let shape = npy.file.shape().to_vec();
    if !ranks.contains(&shape.len()) {
        let ranks: Vec<String> = ranks.iter().map(usize::to_string).collect();
        return Err(NpyError::Shape {
            path: path.to_path_buf(),
            found: shape,
            expected: format!("{} dimensions", ranks.join(" or ")),
        });
    }
    Ok(shape)
}

/// Reads a file's integers, widened to i128.
type WideRead = fn(npyz::NpyFile<BufReader<File>>) -> std::io::Result<Vec<i128>>;

fn widen_ints<T: npyz::Deserialize + Into<i128>>(
    npy: npyz::NpyFile<BufReader<File>>,
) -> std::io::Result<Vec<i128>> {
    Ok(npy.into_vec::<T>()?.into_iter().map(Into::into).collect())
}

/// A 1-D or 2-D array of row indices of any little-endian integer type, as u32 in row
/// order, with its shape.
pub fn read_indices(path: &Path) -> Result<(Vec<u64>, Vec<u32>), NpyError> {
    let npy = open(path)?;
    let shape = npy.file.shape().to_vec();
    if !(1..=2).contains(&shape.len()) {
        return Err(NpyError::Shape {
            path: path.to_path_buf(),
            found: shape,
            expected: "1 or 2 dimensions".into(),
        });
    }
    let found = descr(&npy);
    let (element_bytes, read): (u64, WideRead) = match found.as_str() {
        "<i4" => (4, widen_ints::<i32>),
        "<i8" => (8, widen_ints::<i64>),
        "<u4" => (4, widen_ints::<u32>),
        "<u8" => (8, widen_ints::<u64>),
        _ => {
            return Err(NpyError::DType {
                path: path.to_path_buf(),
                found,
                expected: "an integer type (int32, int64, uint32, uint64)",
            });
        }
    };
    check_size(path, &npy, element_bytes)?;
    let wide = read(npy.file).map_err(io(path))?;
    let indices = wide
        .iter()
        .enumerate()
        .map(|(index, &value)| {
            u32::try_from(value).map_err(|_| NpyError::Index {
                path: path.to_path_buf(),
                index,
                value,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((shape, indices))
}

/// Writes `data` as a little-endian f32 array of `shape`.
pub fn write_f32(path: &Path, shape: &[u64], data: &[f32]) -> Result<(), NpyError> {
    write_values(path, shape, data.iter().copied())
}

/// Writes `data` rounded to `dtype` (to nearest even) in the layout [`read_float`] reads:
/// f32, f16, or bf16 bits as uint16.
pub fn write_as(path: &Path, shape: &[u64], data: &[f32], dtype: Dtype) -> Result<(), NpyError> {
    match dtype {
        Dtype::F32 => write_f32(path, shape, data),
        Dtype::F16 => write_values(path, shape, data.iter().map(|&x| f16::from_f32(x))),
        Dtype::Bf16 => write_values(
            path,
            shape,
            data.iter().map(|&x| bf16::from_f32(x).to_bits()),
        ),
    }
}

fn write_values<T: npyz::AutoSerialize>(
    path: &Path,
    shape: &[u64],
    values: impl Iterator<Item = T>,
) -> Result<(), NpyError> {
    let file = File::create(path).map_err(io(path))?;
    let mut writer = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(BufWriter::new(file))
        .begin_nd()
        .map_err(io(path))?;
    writer.extend(values).map_err(io(path))?;
    writer.finish().map_err(io(path))
}
