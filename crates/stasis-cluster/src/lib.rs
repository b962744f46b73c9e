//! Consistent checkpoints of an application spread over several hosts
//! (`stasis agent`, `stasis cluster`): the protocol ([`protocol`], its
//! specification in the module docs), the agent that dumps, restores and
//! commits the trees of its host ([`agent`]), its storage of the jobs
//! ([`jobs`], [`storage`]), and the coordinator ([`coordinator`]).

pub mod agent;
pub mod coordinator;
mod error;
mod identity;
pub mod jobs;
pub mod peers;
pub mod protocol;
pub mod storage;
mod trackers;

pub use error::ClusterError;
