//! The library's error type: every message names the file, key or tensor at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
/// Every error the library returns; each message names the file or argument at fault.
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {err}")]
    Io {
        /// The file at fault.
        path: PathBuf,
        /// The underlying I/O error.
        err: std::io::Error,
    },
    /// A config.json that is malformed, lacks a key or describes an impossible model.
    #[error("{path}: {msg}")]
    Config {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A checkpoint whose tensors do not match the config.
    #[error("{path}: {msg}")]
    Checkpoint {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Anything wrong with input data or tokenizers.
    #[error("{path}: {msg}")]
    Data {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A bad argument (shape, length, range) passed by the caller.
    #[error("{0}")]
    Invalid(String),
}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            err: source,
        }
    }
}
