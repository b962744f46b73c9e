//! libstasis: application-level checkpointing for C and Python programs.
//!
//! A program names the memory that holds its state (`stasis_protect`), and
//! checkpoints it at safe points (`stasis_checkpoint`); after a crash it
//! asks for the newest complete version (`stasis_restart_test`) and refills
//! its memory in place (`stasis_restart`). The API follows VeloC's. Each
//! checkpoint after the first copies only what was written since the
//! previous one, found by one of the monitoring modes of [`monitor`]; the
//! default `acck` mode is the ACCK paper's adaptive coarse-grained
//! monitoring ([`policy`]). See `docs/libstasis.md`.
//!
//! * [`ffi`]: the C functions (the only `unsafe` of this crate).
//! * [`api`]: the same operations in Rust, over one process-wide state.
//! * [`monitor`], [`policy`], [`selfuffd`]: write monitoring.
//! * [`format`], [`store`]: checkpoint files and targets.
//! * [`request`]: `stasis_request_checkpoint`, the client of `stasis run`.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]
#![deny(unsafe_code)]

pub mod api;
pub mod bits;
pub mod config;
pub mod error;
#[allow(unsafe_code)]
pub mod ffi;
pub mod format;
pub mod monitor;
pub mod policy;
pub mod request;
pub mod selfuffd;
pub mod store;

pub use error::AppError;
