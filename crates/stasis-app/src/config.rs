//! Configuration: the C `struct stasis_config`, environment overrides, and
//! the resolved [`Config`] the library runs with.
//!
//! A field left at 0 in `struct stasis_config` (or a NULL config) takes the
//! environment variable named beside it, else the default:
//!
//! | field | variable | values | default |
//! |---|---|---|---|
//! | `monitor` | `STASIS_MONITOR` | `auto`, `full`, `page`, `acck`, `uffd` | `auto` |
//! | `target` | `STASIS_TARGET` | `dir`, `pmem` | `dir` |
//! | `max_versions` | `STASIS_MAX_VERSIONS` | >= 1 | 2 |
//! | `acck_n` | `STASIS_ACCK_N` | 0..=20 pieces exponent | 6 |
//! | `acck_hot_percent` | `STASIS_ACCK_HOT` | 1..=100 | 80 |
//! | `acck_window_percent` | `STASIS_ACCK_WINDOW` | 1..=100 (paper: 10) | 100 |
//! | `huge_pages` | `STASIS_HUGE` | 1 on, -1 off | off |
//! | `pmem_latency_ns` | `STASIS_PMEM_LATENCY_NS` | ns added per 64-byte line | 0 |

use std::ffi::c_int;

use crate::error::{AppError, Result};
use crate::policy::AcckParams;

/// `monitor`: the environment's choice, else `auto`.
pub const STASIS_MONITOR_DEFAULT: i32 = 0;
/// `monitor`: `uffd` where the kernel has it, else `acck`.
pub const STASIS_MONITOR_AUTO: i32 = 1;
/// `monitor`: no monitoring, every protected byte copied.
pub const STASIS_MONITOR_FULL: i32 = 2;
/// `monitor`: mprotect + SIGSEGV per 4 KiB page.
pub const STASIS_MONITOR_PAGE: i32 = 3;
/// `monitor`: the ACCK adaptive coarse-grained monitoring.
pub const STASIS_MONITOR_ACCK: i32 = 4;
/// `monitor`: userfaultfd write-protection (async) + PAGEMAP_SCAN.
pub const STASIS_MONITOR_UFFD: i32 = 5;

/// `target`: the environment's choice, else a directory.
pub const STASIS_TARGET_DEFAULT: i32 = 0;
/// `target`: a directory of checkpoint files.
pub const STASIS_TARGET_DIR: i32 = 1;
/// `target`: a persistent-memory file (two slots, checksummed header).
pub const STASIS_TARGET_PMEM: i32 = 2;

/// Options of `stasis_init`; zeroed fields take the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct stasis_config {
    /// One of `STASIS_MONITOR_*`.
    pub monitor: c_int,
    /// One of `STASIS_TARGET_*`.
    pub target: c_int,
    /// Complete versions kept per checkpoint name.
    pub max_versions: c_int,
    /// ACCK: each region is split into 2^acck_n pieces.
    pub acck_n: c_int,
    /// ACCK: a piece is hot when this percentage of its window was written.
    pub acck_hot_percent: c_int,
    /// ACCK: the window is this percentage of a piece's first pages.
    pub acck_window_percent: c_int,
    /// 1: collapse released runs of >= 512 pages into huge pages; -1: never.
    pub huge_pages: c_int,
    /// Persistent-memory target: emulated write latency per cache line.
    pub pmem_latency_ns: u64,
}

/// How writes are monitored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Full,
    Page,
    Acck,
    Uffd,
}

impl Mode {
    /// The mode's name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Page => "page",
            Mode::Acck => "acck",
            Mode::Uffd => "uffd",
        }
    }

    /// The mode's `STASIS_MONITOR_*` code.
    pub fn code(self) -> i32 {
        match self {
            Mode::Full => STASIS_MONITOR_FULL,
            Mode::Page => STASIS_MONITOR_PAGE,
            Mode::Acck => STASIS_MONITOR_ACCK,
            Mode::Uffd => STASIS_MONITOR_UFFD,
        }
    }
}

/// Where checkpoints go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    Dir,
    Pmem,
}

/// The resolved configuration (`None` mode: `auto`, decided at init).
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Option<Mode>,
    pub target: TargetKind,
    pub max_versions: usize,
    pub acck: AcckParams,
    pub huge_pages: bool,
    pub pmem_latency_ns: u64,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_num(name: &str) -> Result<Option<i64>> {
    env(name)
        .map(|v| {
            v.trim()
                .parse::<i64>()
                .map_err(|_| AppError::Invalid(format!("{name}={v} is not a number")))
        })
        .transpose()
}

fn pick(field: i64, var: &str, default: i64) -> Result<i64> {
    if field != 0 {
        return Ok(field);
    }
    Ok(env_num(var)?.unwrap_or(default))
}

fn mode_from_code(code: i32) -> Result<Option<Mode>> {
    Ok(match code {
        STASIS_MONITOR_AUTO => None,
        STASIS_MONITOR_FULL => Some(Mode::Full),
        STASIS_MONITOR_PAGE => Some(Mode::Page),
        STASIS_MONITOR_ACCK => Some(Mode::Acck),
        STASIS_MONITOR_UFFD => Some(Mode::Uffd),
        c => return Err(AppError::Invalid(format!("unknown monitor {c}"))),
    })
}

fn mode_from_name(s: &str) -> Result<Option<Mode>> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "auto" => None,
        "full" => Some(Mode::Full),
        "page" => Some(Mode::Page),
        "acck" => Some(Mode::Acck),
        "uffd" => Some(Mode::Uffd),
        o => {
            return Err(AppError::Invalid(format!(
                "STASIS_MONITOR={o}: use auto, full, page, acck or uffd"
            )))
        }
    })
}

fn in_range(name: &str, v: i64, lo: i64, hi: i64) -> Result<i64> {
    if v < lo || v > hi {
        return Err(AppError::Invalid(format!(
            "{name} = {v}: must be in {lo}..={hi}"
        )));
    }
    Ok(v)
}

impl Config {
    /// Resolves a C config (or none) against the environment.
    pub fn resolve(c: Option<&stasis_config>) -> Result<Self> {
        let c = c.copied().unwrap_or_default();
        let mode = match c.monitor {
            STASIS_MONITOR_DEFAULT => match env("STASIS_MONITOR") {
                Some(s) => mode_from_name(&s)?,
                None => None,
            },
            code => mode_from_code(code)?,
        };
        let target = match c.target {
            STASIS_TARGET_DIR => TargetKind::Dir,
            STASIS_TARGET_PMEM => TargetKind::Pmem,
            STASIS_TARGET_DEFAULT => match env("STASIS_TARGET").as_deref() {
                None | Some("dir") => TargetKind::Dir,
                Some("pmem") => TargetKind::Pmem,
                Some(o) => {
                    return Err(AppError::Invalid(format!(
                        "STASIS_TARGET={o}: use dir or pmem"
                    )))
                }
            },
            t => return Err(AppError::Invalid(format!("unknown target {t}"))),
        };
        let max_versions = in_range(
            "max_versions",
            pick(c.max_versions.into(), "STASIS_MAX_VERSIONS", 2)?,
            1,
            1 << 20,
        )?;
        let n = in_range("acck_n", pick(c.acck_n.into(), "STASIS_ACCK_N", 6)?, 0, 20)?;
        let hot = in_range(
            "acck_hot_percent",
            pick(c.acck_hot_percent.into(), "STASIS_ACCK_HOT", 80)?,
            1,
            100,
        )?;
        let window = in_range(
            "acck_window_percent",
            pick(c.acck_window_percent.into(), "STASIS_ACCK_WINDOW", 100)?,
            1,
            100,
        )?;
        let huge = pick(c.huge_pages.into(), "STASIS_HUGE", -1)? > 0;
        let latency = if c.pmem_latency_ns != 0 {
            c.pmem_latency_ns
        } else {
            u64::try_from(env_num("STASIS_PMEM_LATENCY_NS")?.unwrap_or(0).max(0)).unwrap_or(0)
        };
        Ok(Self {
            mode,
            target,
            max_versions: usize::try_from(max_versions).unwrap_or(2),
            acck: AcckParams {
                n: u32::try_from(n).unwrap_or(6),
                hot_percent: u32::try_from(hot).unwrap_or(80),
                window_percent: u32::try_from(window).unwrap_or(100),
            },
            huge_pages: huge,
            pmem_latency_ns: latency,
        })
    }
}
