//! The persistent-memory target (not written yet).

use std::path::Path;

use crate::error::{AppError, Result};
use crate::format::{Meta, Snapshot};

use super::Target;

/// A persistent-memory file.
#[derive(Debug)]
pub struct PmemTarget;

impl PmemTarget {
    /// Opens the target.
    pub fn open(_dir: &Path, _latency_ns: u64) -> Result<Self> {
        Err(AppError::Invalid(
            "the pmem target is not implemented yet".into(),
        ))
    }
}

impl Target for PmemTarget {
    fn takes_deltas(&self) -> bool {
        false
    }
    fn commit(&mut self, _name: &str, _meta: &Meta, _snap: &Snapshot) -> Result<u64> {
        Err(AppError::Invalid("pmem".into()))
    }
    fn latest(&self, _name: &str) -> Result<Option<i32>> {
        Ok(None)
    }
    fn load(&self, name: &str, version: i32) -> Result<(Meta, Vec<Snapshot>)> {
        Err(AppError::NotFound {
            name: name.into(),
            version,
        })
    }
}
